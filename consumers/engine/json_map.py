"""`--transform json`: a JSON record onto the sink table's own columns, by the table's own types, without code.

Compiled once per pipeline, never interpreted per record:
  1. `read_columns` reads the table's columns from PostgreSQL's catalog (type, precision and scale, length,
     nullability, default);
  2. `plan` gives each written column its source -- the top-level field of its name, or what `--map
     COLUMN=SOURCE` says -- and refuses what cannot work (an unknown column or source, a NOT NULL column
     nothing writes);
  3. `JsonPlan.transform()` turns the plan into a `Transform`: per column its getter and its type's converter
     (chosen here), and a row function generated as straight-line code that parses the value once, inlines each
     column's common case and calls the converter for the rest (consumers/engine/json_rows.py).

A record that cannot be converted raises BadRecord naming the column, its source and the value (cut short);
the commit protocol makes it a dead letter. Columns with a database default (or identity) take their default
unless a `--map` names them (COPY cannot ask for a default per row); provenance and generated columns, and a
GENERATED ALWAYS identity (INSERT refuses a value for it: an upsert's batches, a replay), are never written by the
mapping. A run whose table changed under it so (lifecycle.target_of) ends as a sink error saying why.

SOURCE is a dotted path into the value (`customer.name`, `items.0.sku`), `@key` (the key as text),
`@key.PATH` (a path into a JSON key), `@timestamp` (the record's timestamp), `@partition`, `@offset` or
`@header:NAME` (a header's value as text). A number written into a timestamp, timestamptz or date column
(or an array of them) counts epoch milliseconds unless the source names its unit: `SOURCE::seconds`,
`::milliseconds`, `::microseconds` or `::nanoseconds` (`created_at=ts::seconds`); under a named unit, the
number written as text ("1764288000") is read too. The unit is a suffix of the
source, so every door (`--map`, the API's and the form's `map`, pipelines.toml) takes it as it takes a source;
it is chosen when the plan compiles, never per record (consumers/engine/json_time.py). "::" and not ":" because
`@header:NAME` and real field names (`urn:...`) hold a colon, and a shell passes "::" unquoted.
"""
import dataclasses
import functools
import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

import orjson
from psycopg2 import sql

from consumers.engine import json_rows, json_time
from consumers.engine.record_ids import NUMERIC_MAX_SCALE, NUMERIC_MAX_WEIGHT
from consumers.engine.transforms import BadRecord, SourceRecord, Transform

NAME = "json"
# Written by the commit protocol, never by a mapping.
PROVENANCE_COLUMNS = ("source_topic", "source_partition", "source_offset", "source_row")
RECORD_SOURCES = ("@key", "@timestamp", "@partition", "@offset")
SHOWN_VALUE_CHARS = 60  # a dead letter's error shows this much of the value that would not convert
INTEGER_RANGES = {"int2": (-2 ** 15, 2 ** 15 - 1), "int4": (-2 ** 31, 2 ** 31 - 1), "int8": (-2 ** 63, 2 ** 63 - 1)}
MAX_INTEGER_DIGITS = 19   # a bigint's; a Decimal with more is out of range before int() (quadratic in its digits)
TEXT_TYPES = ("text", "varchar", "bpchar", "name", "citext")
# Rounding to a numeric's scale in Python's default context (28 digits) fails for wider numbers (numeric(78,0) holds
# a uint256): this one holds any numeric(p,s) PostgreSQL allows (p <= 1000), and a number beyond it is too long.
NUMERIC_CONTEXT = Context(prec=2100)
MISSING = object()
# orjson reads every number with a fraction or an exponent as a float, and an integer beyond 64 bits too. A float
# holds a number's text exactly when that text is the float's shortest one (what most producers write), not a
# longer one (0.12345678901234567890 would lose the digits a numeric or jsonb column keeps). Values with a run of 16
# digits and points are looked at number by number (`_orjson_exact`); one orjson would change goes to json.loads,
# which reads such a number as a Decimal (`_number`). The run is found by mapping digits and "." to "0" and the
# rest to " " (bytes.translate runs in C) and looking for 16 zeros: several times faster than a regular expression.
_DIGITS_ONLY = bytes(48 if 48 <= b <= 57 or b == 46 else 32 for b in range(256))
_LONG_NUMBER = b"0" * 16
_LONG_NUMBER_TEXT = re.compile(rb"[0-9][0-9.]{15,}(?:[eE][+-]?[0-9]+)?")
# orjson also reads a number too small for a float (1e-400) as 0.0: one with an exponent of -300 or below goes to
# json.loads, which keeps it as its Decimal (a float column refuses it, a numeric or jsonb one keeps it). A text
# like "line-300" only sends its record the slower way.
_TINY_EXPONENT = re.compile(rb"[eE]-0*(?:[3-9][0-9]{2}|[1-9][0-9]{3,})")


def loads(value):
    """A record's value parsed as json.loads parses it, by orjson (several times faster) where that gives the same
    result, else by json.loads (long numbers, NaN, lone surrogates, a byte-order mark); a number a float does not
    hold as written (more than 15 significant digits, beyond a float's range) is a Decimal."""
    if type(value) is bytes and (_LONG_NUMBER not in value.translate(_DIGITS_ONLY) or _orjson_exact(value)) \
            and not ((b"e-" in value or b"E-" in value) and _TINY_EXPONENT.search(value)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            pass
    return json.loads(value, parse_float=_number)


def _orjson_exact(value: bytes) -> bool:
    """Whether orjson reads each long number of `value` as written: an integer of up to 18 digits, or a number
    whose text is its float's shortest one. (A run of digits inside a string may be looked at too: harmless.)"""
    for text in _LONG_NUMBER_TEXT.findall(value):
        if b"." not in text and b"e" not in text and b"E" not in text:
            if len(text) >= 19:
                return False
            continue
        try:
            number = float(text)
        except ValueError:
            continue   # not a number ("2024.05.01.12.30.00", in a string)
        if repr(number).encode() != text and type(_number(text.decode())) is Decimal:
            return False
    return True


def _number(text: str):
    """A JSON number with a fraction or an exponent: a float when the float is that number, else its Decimal."""
    number = float(text)
    # Most producers write a float's shortest text, which reads back as it is: the cheap test first.
    if repr(number) == text or (math.isfinite(number) and Decimal(repr(number)) == Decimal(text)):
        return number
    return Decimal(text)


def dumps(value) -> str:
    """Compact JSON text of a parsed value (orjson; for integers beyond 64 bits and Decimals, _json_text)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return _json_text(value, (",", ":"))


def _json_text(value, separators: tuple[str, str]) -> str:
    """json.dumps(value, ensure_ascii=False), with each Decimal written as the number it is."""
    if type(value) is Decimal:
        return str(value)
    if type(value) is dict:
        return "{" + separators[0].join(json.dumps(key, ensure_ascii=False) + separators[1] +
                                        _json_text(item, separators) for key, item in value.items()) + "}"
    if type(value) is list:
        return "[" + separators[0].join(_json_text(item, separators) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False, separators=separators)


class MappingInvalid(ValueError):
    """The mapping cannot work with this table: `problems` names each column or source and what to do."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class Column:
    """A sink column as the catalog describes it."""

    name: str
    pg_type: str            # format_type(): "numeric(12,2)", "character varying(20)", ...
    base: str               # the base type's typname: int8, numeric, varchar, timestamptz, jsonb, ...
    nullable: bool
    has_default: bool       # a default, an identity or a domain's default: PostgreSQL fills it when not written
    generated: bool = False
    always_identity: bool = False  # GENERATED ALWAYS AS IDENTITY: INSERT refuses a value for it (428C9)
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    element: str | None = None  # an array's element type (typname): int4 for integer[]; precision etc. are its
    collation: str | None = None  # a nondeterministic collation ('a' = 'A'), qualified and quoted as SQL

    @property
    def sql_type(self) -> str:
        """The type as casts must name it: with a nondeterministic collation, which makes equal what Python
        does not (the upsert's keys, consumers/engine/upsert.py)."""
        return self.pg_type if self.collation is None else f"{self.pg_type} COLLATE {self.collation}"

    @property
    def required(self) -> bool:
        return not self.nullable and not self.has_default


def read_columns(cursor, table: str) -> list[Column] | None:
    """The table's columns in order (None when there is no such table), from pg_catalog: domains are read as
    their innermost base type (a domain may be over another), and a domain's DEFAULT is the column's default when
    the column has none of its own."""
    cursor.execute("SELECT to_regclass(%s)", [sql.Identifier(table).as_string(cursor)])
    if cursor.fetchone()[0] is None:
        return None
    cursor.execute(
        # A domain over a domain: walked down to its base type, gathering NOT NULL and the nearest typmod on the way.
        "WITH RECURSIVE domains (oid, base, not_null, typmod) AS ("
        "SELECT oid, typbasetype, typnotnull, typtypmod FROM pg_type WHERE typtype = 'd' UNION ALL "
        "SELECT d.oid, i.typbasetype, d.not_null OR i.typnotnull, CASE WHEN d.typmod >= 0 THEN d.typmod "
        "ELSE i.typtypmod END FROM domains d JOIN pg_type i ON i.oid = d.base AND i.typtype = 'd') "
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), COALESCE(b.typname, t.typname), "
        "NOT a.attnotnull AND NOT COALESCE(d.not_null, false), "
        "a.atthasdef OR a.attidentity <> '' OR t.typdefaultbin IS NOT NULL, "
        "a.attgenerated <> '', a.attidentity = 'a', "
        "CASE WHEN a.atttypmod >= 0 THEN a.atttypmod ELSE d.typmod END, e.typname, "
        "CASE WHEN NOT c.collisdeterministic THEN quote_ident(n.nspname) || '.' || quote_ident(c.collname) END "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "LEFT JOIN (pg_collation c JOIN pg_namespace n ON n.oid = c.collnamespace) ON c.oid = a.attcollation "
        "LEFT JOIN (domains d JOIN pg_type b ON b.oid = d.base AND b.typtype <> 'd') ON d.oid = t.oid "
        "LEFT JOIN pg_type e ON COALESCE(b.typcategory, t.typcategory) = 'A' "
        "AND left(COALESCE(b.typname, t.typname), 1) = '_' AND e.oid = COALESCE(b.typelem, t.typelem) "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [sql.Identifier(table).as_string(cursor)])
    columns = []
    for (name, pg_type, base, nullable, has_default, generated, always_identity, typmod, element,
         collation) in cursor.fetchall():
        precision = scale = length = None
        kind = element or base  # an array's typmod is its elements'
        if kind == "numeric" and typmod is not None and typmod >= 4:
            # The scale is an 11-bit signed number: numeric(2,-3) rounds to thousands (PostgreSQL 15 and later).
            precision, scale = ((typmod - 4) >> 16) & 0xFFFF, (((typmod - 4) & 0x7FF) ^ 0x400) - 0x400
        elif kind in ("varchar", "bpchar") and typmod is not None and typmod >= 4:
            length = typmod - 4
        columns.append(Column(name, pg_type, base, nullable, has_default or generated, generated, always_identity,
                              precision, scale, length, element, collation))
    return columns


# --- sources ---------------------------------------------------------------------------------------------

def parse_source(source: str) -> tuple[str, tuple]:
    """("value", path) | ("key", path) | ("timestamp"|"partition"|"offset", ()) | ("header", (name,)), of the
    source without its unit (split_unit). Raises ValueError with what is wrong."""
    if not isinstance(source, str) or not source:
        raise ValueError("a source must be a dotted path or @key, @timestamp, @partition, @offset, @header:NAME")
    if not source.isprintable():
        raise ValueError("a source is printable text (no control characters)")
    source, unit = json_time.split_unit(source)
    kind, steps = _parse_bare(source)
    if unit is not None and (kind not in ("value", "key") or not steps):
        # The record's timestamp is always milliseconds; a key or header is text, which a unit never reads.
        raise ValueError(f"a unit reads a JSON number: give ::{unit} to a path into the value or into a JSON key "
                         "(@key.PATH), not to " + (source if source.startswith("@") else repr(source)))
    return kind, steps


def _parse_bare(source: str) -> tuple[str, tuple]:
    if not source:
        raise ValueError("a unit needs a source before it (ts::seconds)")
    if source.startswith("@header:"):
        if not source[len("@header:"):]:
            raise ValueError("@header: needs a header name (@header:NAME)")
        return "header", (source[len("@header:"):],)
    if source.startswith("@key."):
        return "key", _path(source[len("@key."):], source)
    if source.startswith("@"):
        if source not in RECORD_SOURCES:
            raise ValueError(f"unknown source {source!r}: use a dotted path, {', '.join(RECORD_SOURCES)} or "
                             "@header:NAME")
        return source[1:], ()
    return "value", _path(source, source)


def _path(text: str, source: str) -> tuple:
    steps = tuple(text.split("."))
    if any(step == "" for step in steps):
        raise ValueError(f"{source!r} has an empty step: write a dotted path such as customer.name or items.0.sku")
    return steps


def _walk(node, steps):
    for step in steps:
        if type(node) is dict:
            node = node.get(step, MISSING)
        elif type(node) is list and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        else:
            return MISSING
        if node is MISSING:
            return MISSING
    return node


def _getter(kind: str, steps: tuple) -> Callable:
    """(doc, record) -> the raw value, MISSING when absent."""
    if kind == "value":
        if len(steps) == 1:
            field = steps[0]
            return lambda doc, record: doc.get(field, MISSING)
        return lambda doc, record: _walk(doc, steps)
    if kind == "key":
        if not steps:
            return lambda doc, record: MISSING if record.key is None else _utf8(record.key, "the key")

        def key_path(doc, record):
            try:
                return MISSING if record.key is None else _walk(loads(record.key), steps)
            except ValueError:
                return MISSING
        return key_path
    if kind == "timestamp":
        return lambda doc, record: MISSING if record.timestamp is None or record.timestamp < 0 \
            else json_time.Millis(record.timestamp)
    if kind == "partition":
        return lambda doc, record: record.partition
    if kind == "offset":
        return lambda doc, record: record.offset
    name = steps[0]

    def header(doc, record):
        for key, value in record.headers or ():
            if key == name:
                return None if value is None else _utf8(value, f"header {name!r}")
        return MISSING
    return header


def _utf8(raw: bytes, what: str) -> str:
    """A key's or header's bytes as text; BadRecord when they are not UTF-8 (never U+FFFD in their place)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord(f"{what} is not UTF-8 text: {_shown(raw.decode('utf-8', 'backslashreplace'))}") from None


# --- converters: raw JSON value -> the value COPY writes (str/int/None); ValueError says why not ----------

def _shown(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text if len(text) <= SHOWN_VALUE_CHARS else text[:SHOWN_VALUE_CHARS] + "...")


def _ascii_number(text: str) -> bool:
    """Python reads other scripts' digits ("١٢") and underscores ("1_000") as numbers; PostgreSQL refuses them,
    so a record holding one is bad, not a number."""
    return bool(text.strip()) and text.isascii() and "_" not in text


def _integer(column: Column):
    low, high = INTEGER_RANGES[column.base]

    def convert(value):
        if type(value) is int or type(value) is json_time.Millis:
            number = int(value)
        elif type(value) is float and value.is_integer():
            number = int(value)
        elif type(value) is Decimal and value.is_finite() and value.adjusted() > MAX_INTEGER_DIGITS:
            # Out of every integer type's range: int() of 1e10000000 would build its ten million digits (an hour)
            raise ValueError(f"out of range for {column.pg_type}")
        elif type(value) is Decimal and value.is_finite() and value == value.to_integral_value():
            number = int(value)
        elif type(value) is str and _ascii_number(value) and value.strip().lstrip("+-").isdigit():
            number = int(value)
        else:
            raise ValueError(f"not an integer for {column.pg_type}")
        if not low <= number <= high:
            raise ValueError(f"out of range for {column.pg_type}")
        return number
    return convert


def _decimal(value) -> Decimal:
    if type(value) is Decimal:
        return value
    if type(value) is float:
        return Decimal(repr(value))  # the shortest text that reads back as this float: 19.99, not 19.989999...
    if (isinstance(value, int) and type(value) is not bool) or (type(value) is str and _ascii_number(value)):
        try:
            return Decimal(value.strip() if type(value) is str else int(value))
        except InvalidOperation:
            pass
    raise ValueError("not a number")


def _numeric(column: Column):
    precision, scale = column.precision, column.scale
    quantum = Decimal(1).scaleb(-scale) if precision else None
    limit = Decimal(10) ** (precision - scale) if precision else None
    int_limit = 10 ** (precision - scale) if precision else None

    def convert(value):
        # Fast paths, the common case: an integer within the precision, or a float whose shortest text already
        # fits the scale (19.99 into numeric(10,2)); anything else goes through Decimal.
        kind = type(value)
        if kind is int and (int_limit is None or -int_limit < value < int_limit):
            return str(value)
        if kind is float and quantum is not None:
            text = repr(value)
            whole, dot, fraction = text.lstrip("-").partition(".")
            if whole.isdigit() and len(fraction) <= scale and fraction.isdigit() and int(whole) < int_limit:
                return text
        number = _decimal(value)
        if not number.is_finite():
            raise ValueError(f"not a finite number for {column.pg_type}")
        if quantum is not None:
            try:  # as PostgreSQL rounds to the scale
                number = number.quantize(quantum, rounding=ROUND_HALF_UP, context=NUMERIC_CONTEXT)
            except InvalidOperation:
                raise ValueError(f"too many digits for {column.pg_type}") from None
            if abs(number) >= limit:
                raise ValueError(f"too many digits for {column.pg_type}")
        elif number.as_tuple().exponent < -NUMERIC_MAX_SCALE or (number and number.adjusted() > NUMERIC_MAX_WEIGHT):
            # Beyond what PostgreSQL's numeric holds; written out, 1e100000000 would be a 100 MB value to COPY
            raise ValueError(f"out of range for {column.pg_type}")
        return format(number, "f")
    return convert


def _float(column: Column):
    def convert(value):
        kind = type(value)
        if kind is float:
            return repr(value)
        if kind is int or kind is Decimal or (kind is str and _ascii_number(value)):
            try:
                number = float(value)
            except OverflowError:
                raise ValueError(f"out of range for {column.pg_type}") from None
            except ValueError:
                raise ValueError(f"not a number for {column.pg_type}") from None
            # Beyond a double's range (1e400) or so small it is 0 (1e-400): PostgreSQL refuses it, Python would
            # make it Infinity or 0. Only a spelled infinity ("Infinity", "-inf") is one.
            if (math.isinf(number) and (kind is not str or "inf" not in value.lower())) or \
                    (number == 0 and kind is not int and Decimal(value) != 0):
                raise ValueError(f"out of range for {column.pg_type}")
            return repr(number)
        raise ValueError(f"not a number for {column.pg_type}")
    return convert


def _text(column: Column):
    length = column.length

    def convert(value):
        if type(value) is not str:
            value = _json_text(value, (", ", ": "))
        if "\x00" in value:
            raise ValueError("contains a NUL character, which PostgreSQL text cannot hold")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("contains a lone surrogate, which is not text") from None
        if length is not None and len(value) > length:
            if value[length:].strip(" "):
                raise ValueError(f"longer than {column.pg_type}")
            value = value[:length]  # as PostgreSQL does: only spaces beyond the length are cut, not refused
        return value
    return convert


def _boolean(column: Column):
    def convert(value):
        if value is True or value == "true":
            return "t"
        if value is False or value == "false":
            return "f"
        raise ValueError("not a boolean (true or false)")
    return convert


def _uuid(column: Column):
    def convert(value):
        if type(value) is str:
            try:
                return str(uuid.UUID(value))
            except ValueError:
                pass
        raise ValueError("not a UUID")
    return convert


def _json(column: Column):
    binary = column.base == "jsonb"  # json keeps its text as it is: \u0000 too

    def convert(value):
        text = dumps(value)
        if binary and "\\u0000" in text:
            raise ValueError("contains \\u0000, which jsonb cannot hold")
        if "null" in text and not _finite(value):   # orjson writes NaN and Infinity as null: refuse, not rewrite
            raise ValueError("holds NaN or Infinity, which JSON (and jsonb) cannot hold")
        return text
    return convert


def _finite(value) -> bool:
    try:
        json.dumps(value, allow_nan=False, default=str)  # a Decimal is finite
    except ValueError:
        return False
    return True


def _array(column: Column, unit: str | None = None):
    """A JSON array (of arrays, for more dimensions) -> the array's text, each element converted as a column of the
    element's type would convert it ("2" into integer[] is 2, an object or array into jsonb[] is its JSON); null
    elements are NULL. A string is the array's own text ("{a,b}"), for PostgreSQL to read."""
    element_type = column.pg_type.rstrip("[]")
    convert_element = converter(Column(column.name, element_type, column.element, True, False,
                                       precision=column.precision, scale=column.scale, length=column.length), unit)

    json_elements = column.element in ("json", "jsonb")

    def literal(items, path: str) -> str:
        cells = []
        for index, item in enumerate(items):
            if item is None:
                cells.append("NULL")
            elif type(item) is list and not json_elements:  # a dimension more; in jsonb[], a JSON value
                cells.append(literal(item, f"{path}{index}."))
            else:
                try:
                    text = str(convert_element(item))
                except ValueError as exc:
                    raise ValueError(f"element {path}{index}: {exc}") from None
                cells.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
        return "{" + ",".join(cells) + "}"

    as_text = _text(dataclasses.replace(column, length=None))  # the length is the elements'

    def convert(value):
        if type(value) is list:
            return literal(value, "")
        if type(value) is str:
            return as_text(value)
        raise ValueError(f"not an array for {column.pg_type}")
    return convert


CONVERTERS = {"int2": _integer, "int4": _integer, "int8": _integer, "numeric": _numeric, "float4": _float,
              "float8": _float, "bool": _boolean, "timestamptz": json_time.timestamptz,
              "timestamp": json_time.timestamp, "date": json_time.date_of, "uuid": _uuid, "jsonb": _json, "json": _json,
              **{name: _text for name in TEXT_TYPES}}


def converter(column: Column, unit: str | None = None) -> Callable:
    """The column's converter; `unit` (plan() allows it on time types only) is how it reads an epoch number."""
    # Any other type: its text goes to PostgreSQL, whose input function decides (a refusal is a dead letter).
    if column.element is not None:
        return _array(column, unit)
    make = CONVERTERS.get(column.base, _text)
    return make(column) if unit is None else make(column, unit)


# --- the plan and its compiled transform -----------------------------------------------------------------

@dataclass(frozen=True)
class Written:
    column: Column
    source: str           # as the user wrote it (shown in errors), or the column's name by default
    field: bool = False   # no --map: the top-level field of the column's name, as it is ("user.id", "x.")

    @property
    def unit(self) -> str | None:
        """The epoch unit the source names (`ts::seconds`), None for the default (milliseconds)."""
        return None if self.field else json_time.split_unit(self.source)[1]


@dataclass(frozen=True)
class JsonPlan:
    """Which columns a pipeline writes and from where: plain values, so it travels to Spark executors, which
    compile it there (`transform()`)."""

    columns: tuple[Written, ...]

    @property
    def column_names(self) -> list[str]:
        return [w.column.name for w in self.columns]

    def key_sources(self, key: tuple[str, ...]) -> list[str]:
        by_name = {w.column.name: w.source for w in self.columns}
        return [by_name.get(name, "") for name in key]

    def transform(self, upsert_key: tuple[str, ...] = ()) -> Transform:
        sources = [("value", (w.source,)) if w.field else parse_source(w.source) for w in self.columns]
        getters = [_getter(*source) for source in sources]
        finishes = [_finish(w) for w in self.columns]
        reads_value = any(kind == "value" for kind, _ in sources)
        row = json_rows.generate([(*source, w.column, get, finish) for source, w, get, finish
                                  in zip(sources, self.columns, getters, finishes, strict=True)],
                                 _parse, _not_object, reads_value,
                                 {"MISSING": MISSING, "INTEGER_RANGES": INTEGER_RANGES, "DIGITS_ONLY": _DIGITS_ONLY,
                                  "LONG_NUMBER": _LONG_NUMBER, "ORJSON_EXACT": _orjson_exact,
                                  "TINY_EXPONENT": _TINY_EXPONENT.search,
                                  "PLAIN_TIMESTAMP": json_time.PLAIN_TIMESTAMP.fullmatch,
                                  "VALID_TIMESTAMP": json_time.valid_timestamp}, upsert_key)

        tombstone_key = None
        index = {w.column.name: i for i, w in enumerate(self.columns)}
        if upsert_key and all(name in index and sources[index[name]][0] != "value" for name in upsert_key):
            key_cells = [(getters[index[name]], finishes[index[name]]) for name in upsert_key]

            def tombstone_key(record: SourceRecord):
                return tuple(finish(get(None, record)) for get, finish in key_cells)

        return Transform(NAME, tuple((w.column.name, w.column.sql_type) for w in self.columns), row,
                         description="JSON fields onto the table's columns, by the table's types",
                         tombstone_key=tombstone_key, takes_polled_records=True)


def _parse(record: SourceRecord):
    """The record's value parsed; BadRecord for a tombstone or a value that is not JSON."""
    value = record.value
    if value is None:
        raise BadRecord("the value is null (a tombstone), not a JSON object")
    try:
        return loads(value)
    except ValueError as exc:
        raise BadRecord(f"the value is not JSON ({exc}): {_shown(_text_of(value))}") from None


def _not_object(record: SourceRecord):
    raise BadRecord(f"the value is JSON but not an object: {_shown(_text_of(record.value))}")


def _text_of(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def raw_getter(written: Written) -> Callable:
    """(parsed value, record) -> what the column's source holds before conversion (MISSING when absent)."""
    return _getter(*(("value", (written.source,)) if written.field else parse_source(written.source)))


def _finish(written: Written) -> Callable:
    """raw value -> the column's COPY value (None for a missing or null value where the column allows it);
    BadRecord naming the column, source and value."""
    column, source = written.column, written.source
    convert = converter(column, written.unit)  # the unit is chosen here, once per plan
    nullable, name = column.nullable, column.name
    # COPY cannot ask for a default per row: a mapped column's default never applies.
    default_note = " (its default applies only when no --map names it)" if column.has_default else ""

    def finish(value):
        if value is None or value is MISSING:
            if nullable:
                return None
            raise BadRecord(f"column {name} (from {source}): {'missing' if value is MISSING else 'null'}, and "
                            f"the column is NOT NULL{default_note}")
        try:
            return convert(value)
        except ValueError as exc:
            raise BadRecord(f"column {name} (from {source}): {exc}: {_shown(value)}") from None
    return finish


def plan(columns: list[Column], mapping: dict[str, str]) -> JsonPlan:
    """The columns to write and their sources; MappingInvalid with every problem."""
    problems = []
    by_name = {c.name: c for c in columns}
    for name, source in mapping.items():
        column = by_name.get(name)
        if column is None:
            problems.append(f"--map {name}={source}: the table has no column {name!r}")
        elif name in PROVENANCE_COLUMNS or column.generated:
            problems.append(f"--map {name}={source}: column {name!r} is written by "
                            f"{'PostgreSQL' if column.generated else 'Tally (provenance)'}, not by the mapping")
        elif column.always_identity:
            # COPY writes it anyway, but INSERT ... SELECT (every upsert batch, a replay after a rewind) refuses it.
            problems.append(f"--map {name}={source}: column {name!r} is GENERATED ALWAYS AS IDENTITY, which the "
                            "database fills and refuses a value for (an upsert or a replay would fail on every "
                            "batch): make it GENERATED BY DEFAULT (ALTER COLUMN ... SET GENERATED BY DEFAULT), or "
                            "leave it out of the map")
        try:
            parse_source(source)
        except ValueError as exc:
            problems.append(f"--map {name}={source}: {exc}")
            continue
        unit = json_time.split_unit(source)[1]
        if unit is not None and column is not None and (column.element or column.base) not in json_time.TIME_TYPES:
            problems.append(f"--map {name}={source}: a unit reads a number as an epoch time, for a timestamp, "
                            f"timestamptz or date column; column {name!r} is {column.pg_type}")
    written = []
    for column in columns:
        if column.name in PROVENANCE_COLUMNS or column.generated:
            continue
        if column.name in mapping:
            written.append(Written(column, mapping[column.name]))
        elif not column.has_default:
            written.append(Written(column, column.name, field=True))
    if not written and not problems:
        problems.append("the table has no column the mapping could write")
    if problems:
        raise MappingInvalid(problems)
    return JsonPlan(tuple(written))


def plan_for_table(cursor, table: str, mapping: dict[str, str]) -> JsonPlan:
    columns = read_columns(cursor, table)
    if columns is None:
        raise MappingInvalid([f"sink table {table!r} does not exist: --transform json maps onto an existing table"])
    return plan(columns, mapping)


@functools.lru_cache(maxsize=16)
def compiled(plan: JsonPlan, upsert_key: tuple[str, ...] = ()) -> Transform:
    """The transform of a plan, compiled once per process (Spark executors get the plan with every task)."""
    return plan.transform(upsert_key)


def plan_for_pipeline(pipeline, cursor=None) -> JsonPlan:
    """The plan of a pipeline's stored mapping against its sink table as it is now."""
    if cursor is not None:
        return plan_for_table(cursor, pipeline.sink_table, dict(pipeline.json_map or {}))
    from django.db import connection

    with connection.cursor() as wrapper:
        return plan_for_table(wrapper.cursor, pipeline.sink_table, dict(pipeline.json_map or {}))


def parse_map_options(options: list[str]) -> dict[str, str]:
    """`--map COLUMN=SOURCE` options -> {column: source}; ValueError naming the bad one."""
    mapping = {}
    for option in options:
        column, sep, source = option.partition("=")
        if not sep or not column.strip() or not source.strip():
            raise ValueError(f"--map {option!r}: write COLUMN=SOURCE, e.g. --map order_id=id")
        if column.strip() in mapping:
            raise ValueError(f"--map {option!r}: column {column.strip()!r} is mapped twice")
        mapping[column.strip()] = source.strip()
    return mapping
