"""What in a Kafka record names its row in a team's table: a watch's record-id SPEC and its ignore specs.

    value        the record value as text (UTF-8)
    key          the record key as text
    json:PATH    a field of the JSON value, PATH dotted (`order.id`; a number picks a list's item, as in a
                 pipeline's --map: `items.0.sku`); a string as it is, a number or a boolean as JSON writes it
                 (`42`, `true`)
    offset       the record's partition and offset (the table holds both: --row-id PART_COL,OFFSET_COL)

An ignore spec is SPEC=VALUE (`json:type=heartbeat`, `key=ping`): records whose SPEC gives VALUE are
skipped by the consumer on purpose, so no row is expected for them.

A record whose id cannot be derived (no value, not UTF-8, not JSON, no such field, a JSON object or list
at PATH) gives None: no row can name it, so it is counted as unreadable, never as lost.
"""
import json
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

OFFSET = "offset"
KINDS = ("value", "key", "json", OFFSET)
INTEGER = re.compile(r"^-?[0-9]{1,19}$")
INTEGER_BITS = {"smallint": 15, "integer": 31, "bigint": 63}   # a value's bits besides its sign
# PostgreSQL's numeric holds up to 131,072 digits before the decimal point and 16,383 after it: a number beyond
# either is refused by its input ("value overflows numeric format"), so no row of a numeric column can name it.
NUMERIC_MAX_WEIGHT, NUMERIC_MAX_SCALE = 131_071, 16_383


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class RecordIdSpec:
    kind: str                      # value | key | json | offset
    path: tuple[str, ...] = ()     # for json

    @property
    def columns(self) -> int:
        """How many row-id columns the table needs for this spec."""
        return 2 if self.kind == OFFSET else 1

    def __str__(self):
        return f"json:{'.'.join(self.path)}" if self.kind == "json" else self.kind

    def extract(self, key: bytes | None, value: bytes | None) -> str | None:
        """The record's id as text (None: it has none). Not for `offset`, whose id is the position."""
        if self.kind == "value":
            return _text(value)
        if self.kind == "key":
            return _text(key)
        if self.kind == "json":
            return json_field(value, self.path)
        raise SpecError("an offset id is the record's position, not a field")


def parse_spec(text: str) -> RecordIdSpec:
    if not isinstance(text, str) or not text:
        raise SpecError("a record id is one of value, key, json:PATH or offset")
    if text in ("value", "key", OFFSET):
        return RecordIdSpec(text)
    if text.startswith("json:"):
        path = tuple(text[5:].split("."))
        if not all(path):
            raise SpecError(f"{text!r}: json:PATH needs a dotted path of field names, e.g. json:order.id")
        return RecordIdSpec("json", path)
    raise SpecError(f"unknown record id {text!r}: use value, key, json:PATH or offset")


@dataclass(frozen=True)
class IgnoreSpec:
    spec: RecordIdSpec
    value: str

    def __str__(self):
        return f"{self.spec}={self.value}"

    def matches(self, key: bytes | None, value: bytes | None) -> bool:
        return self.spec.extract(key, value) == self.value


def parse_ignore(text: str) -> IgnoreSpec:
    if not isinstance(text, str) or "=" not in text:
        raise SpecError(f"{text!r}: an ignore spec is SPEC=VALUE, e.g. json:type=heartbeat")
    spec_text, _, expected = text.partition("=")
    spec = parse_spec(spec_text)
    if spec.kind == OFFSET:
        raise SpecError(f"{text!r}: ignore by value, key or json:PATH, not by offset")
    return IgnoreSpec(spec, expected)


def derive(spec: RecordIdSpec | None, ignores, normalise, key: bytes | None, value: bytes | None
           ) -> tuple[str | None, bool]:
    """(the record's id as the row-id column holds it, whether an ignore spec names it): what the audit
    expects of one record, on PostgreSQL's path and on Spark's executors alike. `spec` None: offset ids (the
    id is the position). An ignored record names no row."""
    ignored = any(i.matches(key, value) for i in ignores) if ignores else False
    if spec is None or ignored:
        return None, ignored
    return normalise(spec.extract(key, value)), False


def names_by_key(spec: RecordIdSpec | None, keyed: bool) -> bool:
    """Whether a keyed watch maps a tombstone to a row through its key: with `value` and `json:PATH` ids a tombstone
    (no value) carries no id of its own, so it names its key's latest readable record's (watch_match.TOMBSTONE_IDS)."""
    return keyed and spec is not None and spec.kind in ("value", "json")


def key_text(key: bytes | None) -> str | None:
    """The record key as the audit groups records by it: hex, so any bytes compare equal on both paths."""
    return None if key is None else key.hex()


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def json_field(value: bytes | None, path: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    try:
        found = json.loads(value)
    except (ValueError, UnicodeDecodeError, RecursionError):   # RecursionError: nested thousands deep
        return None
    for name in path:
        if isinstance(found, dict) and name in found:
            found = found[name]
        elif isinstance(found, list) and name.isdigit() and int(name) < len(found):
            found = found[int(name)]
        else:
            return None
    if found is None or isinstance(found, dict | list):
        return None
    if isinstance(found, str):
        try:   # a lone surrogate ("\ud800"): no text column holds it, and the audit's COPY would fail on it
            found.encode("utf-8")
        except UnicodeEncodeError:
            return None
        return found
    return json.dumps(found)


def column_type(pg_type: str) -> str:
    """The temporary id column's type: the row-id column's own where it is a number, a uuid, citext or char(n)
    (so the join can use the table's index, and ids are equal as the column's values are: 'Ann' names the citext
    row 'ann', 'bob  ' the char(5) row 'bob'; char(n) without its length, which would refuse a longer id), text
    for the other text types."""
    base = pg_type.split("(")[0]
    if base in ("smallint", "integer", "bigint"):
        return "bigint"
    if base in ("numeric", "uuid", "citext"):
        return base
    if base in ("character", "bpchar"):
        return "bpchar"
    return "text"


def normaliser(id_type: str | None):
    """record id text -> the value the row-id column can hold, or None: no row of that column can name it."""
    kind = column_type(id_type) if id_type else "text"
    # The column's own width, not the temporary column's bigint: 99999999999 names no row of an integer column
    # (it is unreadable, as on Spark), and comparing the column with it would fail inside PostgreSQL.
    bits = INTEGER_BITS.get(id_type.split("(")[0] if id_type else "", 63)

    def as_bigint(text):
        if text is None or not INTEGER.match(text):
            return None
        number = int(text)
        return str(number) if -2**bits <= number < 2**bits else None

    def as_numeric(text):
        try:
            number = Decimal(text) if text is not None else None
        except InvalidOperation:
            return None
        if number is None or not number.is_finite():
            return None
        if number.as_tuple().exponent < -NUMERIC_MAX_SCALE or (number and number.adjusted() > NUMERIC_MAX_WEIGHT):
            return None   # beyond PostgreSQL's numeric: no row of the column can hold it
        return str(number)

    def as_uuid(text):
        try:
            return str(uuid.UUID(text)) if text is not None else None
        except ValueError:
            return None

    def as_text(text):
        return None if text is None or "\x00" in text else text

    return {"bigint": as_bigint, "numeric": as_numeric, "uuid": as_uuid}.get(kind, as_text)
