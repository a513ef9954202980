"""The row function of a JSON plan, generated as Python source once per plan (consumers/engine/json_map.py).

The hot path of `--transform json` is a handful of operations per column; as one closure call per getter,
converter and error wrapper it cost three calls a column, more than the conversions themselves. So the plan's
row function is written out as straight-line code, once per plan:
  * each column reads its source inline (`doc.get(...)`, one nested step inline, other sources by their getter);
  * each column's common case is inlined as a type test and the value COPY takes -- an integer in range, an
    ASCII string without NUL for text, a boolean, a JSON value orjson serialises;
  * anything else goes to the column's `finish` (json_map's converter with its NULL and error handling), so
    every value that is not the common case converts exactly as before, and every bad one names its column.
The inlined case must give exactly what `finish` gives for it: tests/test_json_map.py runs every good and bad
value through both.

No text from the user enters the generated source: field names, bounds and functions are bound by name in the
function's namespace (`K0`, `F0`, ...), so a field named `"); import os` is only a dictionary key.
"""
from collections.abc import Callable

import orjson

INTEGER_BASES = ("int2", "int4", "int8")
INLINE_TEXT_BASES = ("text", "varchar", "bpchar", "name", "citext")


def _value_getter(i: int, kind: str, steps: tuple, ns: dict) -> list[str]:
    """Lines that leave the source's raw value (or MISSING) in `v`."""
    if kind == "value" and len(steps) == 1:
        ns[f"K{i}"] = steps[0]
        return [f"v = doc.get(K{i}, MISSING)"]
    if kind == "value" and len(steps) == 2 and not steps[1].isdigit():
        ns[f"K{i}"], ns[f"L{i}"] = steps
        return [f"v = doc.get(K{i}, MISSING)",
                f"v = v.get(L{i}, MISSING) if type(v) is dict else G{i}(doc, record)"]
    return [f"v = G{i}(doc, record)"]


def _converted(i: int, column, key: bool, ns: dict) -> list[str]:
    """Lines that leave the column's COPY value in `c{i}`: the inlined common case, else `finish`."""
    base = column.base
    if base in INTEGER_BASES:
        ns[f"LO{i}"], ns[f"HI{i}"] = ns["INTEGER_RANGES"][base]
        return [f"c{i} = v if type(v) is int and LO{i} <= v <= HI{i} else F{i}(v)"]
    if base == "numeric" and not column.precision:
        return [f"c{i} = str(v) if type(v) is int else F{i}(v)"]
    if base == "numeric" and not key:
        # A float well inside the precision goes to COPY as the float itself (its shortest text): PostgreSQL
        # rounds that text to the scale half away from zero, as json_map's converter does with Decimal(repr(v)),
        # and the margin of 1 keeps the rounding from overflowing. Not for a key column: equal keys of one
        # batch are told apart by their values here, so they keep the converter's one spelling.
        ns[f"LIM{i}"] = 10 ** (column.precision - column.scale) - 1
        return [f"c{i} = str(v) if type(v) is int and -LIM{i} < v < LIM{i} else v "
                f"if type(v) is float and -LIM{i} < v < LIM{i} else F{i}(v)"]
    if base == "timestamptz":
        # Plain ISO-8601 text that Python reads as a real date is passed on as it is (PostgreSQL reads it the
        # same way); anything else, and a text that is not a date (2024-02-30), goes to the converter.
        return [f"c{i} = v if type(v) is str and PLAIN_TIMESTAMP(v) is not None and VALID_TIMESTAMP(v) else F{i}(v)"]
    if base in INLINE_TEXT_BASES:
        length = "" if column.length is None else f" and len(v) <= {int(column.length)}"
        return [f"c{i} = v if type(v) is str and v.isascii() and '\\x00' not in v{length} else F{i}(v)"]
    if base == "bool":
        return [f"c{i} = 't' if v is True else 'f' if v is False else F{i}(v)"]
    if base in ("jsonb", "json"):
        # orjson's text is what json_map.dumps gives; a TypeError (an integer beyond 64 bits, a Decimal), a \u0000,
        # which jsonb cannot hold, or a null that may have been NaN or Infinity goes to finish for its own answer.
        return ["if v is None or v is MISSING:", f"    c{i} = F{i}(v)",
                "else:",
                "    try:", f"        c{i} = DUMPS(v).decode()",
                "    except TypeError:", f"        c{i} = F{i}(v)",
                "    else:", f"        if '\\\\u0000' in c{i} or 'null' in c{i}:", f"            c{i} = F{i}(v)"]
    return [f"c{i} = F{i}(v)"]


def generate(columns: list[tuple], parse: Callable, not_object: Callable, reads_value: bool, shared: dict,
             upsert_key: tuple[str, ...] = ()) -> Callable:
    """The row function: record -> ((COPY values in column order),). `columns` holds, per written column,
    (kind, steps, Column, getter, finish): json_map's parsed source, its getter `(doc, record) -> raw value`
    and its converter with NULL and error handling `finish(raw) -> COPY value`. `parse(record)` returns the
    parsed value or raises BadRecord, `not_object(record)` raises it; `shared` holds json_map's MISSING,
    INTEGER_RANGES, DIGITS_ONLY, LONG_NUMBER, ORJSON_EXACT, TINY_EXPONENT, PLAIN_TIMESTAMP and VALID_TIMESTAMP."""
    ns = dict(shared, DUMPS=orjson.dumps, LOADS=orjson.loads, LOADS_ERROR=orjson.JSONDecodeError, PARSE=parse,
              NOT_OBJECT=not_object)
    # json_map.loads inlined: orjson unless a long number of the value is one it would change (ORJSON_EXACT) or
    # one is too small for a float (TINY_EXPONENT);
    # PARSE takes every other case (a tombstone, json.loads, the error).
    lines = ["def row(record):", "    value = record.value",
             "    if type(value) is bytes and (LONG_NUMBER not in value.translate(DIGITS_ONLY)",
             "                                 or ORJSON_EXACT(value)) \\",
             "            and not ((b'e-' in value or b'E-' in value) and TINY_EXPONENT(value)):",
             "        try:", "            doc = LOADS(value)",
             "        except LOADS_ERROR:", "            doc = PARSE(record)",
             "    else:", "        doc = PARSE(record)"]
    if reads_value:
        lines += ["    if type(doc) is not dict:", "        NOT_OBJECT(record)"]
    for i, (kind, steps, column, get, finish) in enumerate(columns):
        ns[f"G{i}"], ns[f"F{i}"] = get, finish
        lines += ["    " + line for line in
                  _value_getter(i, kind, steps, ns) + _converted(i, column, column.name in upsert_key, ns)]
    lines.append("    return ((" + "".join(f"c{i}, " for i in range(len(columns))) + "),)")
    exec(compile("\n".join(lines), "<json_map row>", "exec"), ns)  # noqa: S102 -- no user text in the source
    return ns["row"]
