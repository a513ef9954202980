"""Poison records: values that pass the transform but that PostgreSQL refuses (a number too big for
bigint, a NUL character in text, a lone surrogate, invalid JSON for jsonb).

Database errors are told apart by SQLSTATE class, the one stable contract PostgreSQL gives:
  * data   — class 22 (data exception) and the row-level integrity checks 23502 (NOT NULL), 23503 (a foreign
             key the record names that does not exist), 23514 (CHECK) and 23505 on a unique key of the table's
             own (an order id written twice), or 23P01 on an exclusion constraint of its own (a room booked twice
             for one night): the record's fault. The batch is bisected under savepoints to find
             the records, which become dead letters; the other records commit in the same transaction.
  * transient — class 08 (connection), 40 (serialization failure, deadlock) and 57P (server shutting
             down): the batch is rolled back and the run ends; the supervisor starts a new one.
  * anything else — 42 (missing table, permission denied), 53 (disk full, out of memory), 23505 on the
             provenance key (the table holds rows of the topic already) ...: retrying cannot help, so the run
             ends with an error that names the SQLSTATE, and the supervisor does not restart it (an alert fires
             instead).
"""
import re

import psycopg2

from consumers.engine.sinks import UnencodableValue

DATA_CODES = {"23502", "23503", "23514"}
UNIQUE_VIOLATION = "23505"
EXCLUSION_VIOLATION = "23P01"  # a unique key's kind of refusal by another operator (&&): the record's too
TRANSIENT_CLASSES = ("08", "40")
TRANSIENT_CODES = {"57P01", "57P02", "57P03"}
# The context PostgreSQL gives a COPY row it refuses for one column's value: 'COPY t, line 1, column ip: "999.1"'.
_COPY_COLUMN = re.compile(r"COPY .*?, line [0-9]+, column (.+?): ")
# The detail of a unique violation names the key's columns: 'Key (order_id)=(1) already exists.'
_UNIQUE_KEY = re.compile(r"Key \((.+?)\)=")


def is_data_error(exc: BaseException) -> bool:
    if isinstance(exc, UnencodableValue):
        return True
    code = getattr(exc, "pgcode", None) or ""
    if code in (UNIQUE_VIOLATION, EXCLUSION_VIOLATION):
        return _own_unique_key(exc)
    return code.startswith("22") or code in DATA_CODES


def _own_unique_key(exc: BaseException) -> bool:
    """A unique (or exclusion) violation on a key of the table's own, not on Tally's provenance key (nor one it cannot
    name): 'Key (id)=(1) already exists.', 'Key (id)=(1) conflicts with existing key (id)=(1).'"""
    found = _UNIQUE_KEY.match(getattr(getattr(exc, "diag", None), "message_detail", None) or "")
    return found is not None and "source_offset" not in found.group(1)


def is_transient(exc: BaseException) -> bool:
    code = getattr(exc, "pgcode", None)
    if code is None:
        # No SQLSTATE: the connection broke (psycopg2 OperationalError / InterfaceError without a reply).
        return isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)
    return code.startswith(TRANSIENT_CLASSES) or code in TRANSIENT_CODES


def describe(exc: BaseException) -> str:
    """The database's own error text with its SQLSTATE ("22003 value ... is out of range for type bigint")."""
    diag = getattr(exc, "diag", None)
    if getattr(exc, "pgcode", None) and diag is not None and diag.message_primary:
        text = f"{exc.pgcode} {diag.message_primary}"
        # A value PostgreSQL's own parser refuses ("invalid input syntax for type inet") names no column; COPY's
        # context does: name it, as the JSON mapping's own refusals do.
        copied = _COPY_COLUMN.match(diag.context or "")
        column = diag.column_name or (copied.group(1) if copied else None)
        return f"{text} (column {column})" if column and f'"{column}"' not in text else text
    return f"{type(exc).__name__}: {exc}"


def find_poison(cur, write, groups: list[list[tuple]]) -> dict[int, str]:
    """Write `groups` (the rows of one record each) and return {group index: error} of the groups the
    database refuses because of their data. Good groups are written and kept.

    Bisection under savepoints: a half that writes is released (kept), a half that fails is rolled back
    to its savepoint and split again, so k poison records among n cost about 2·k·log2(n) statements."""
    refused: dict[int, str] = {}
    pending = [(0, len(groups))]
    while pending:
        start, end = pending.pop()
        cur.execute("SAVEPOINT tally_poison")
        try:
            write([row for group in groups[start:end] for row in group])
        except Exception as exc:
            if not is_data_error(exc):
                raise
            cur.execute("ROLLBACK TO SAVEPOINT tally_poison")
            if end - start == 1:
                refused[start] = describe(exc)
                continue
            middle = (start + end) // 2
            pending += [(middle, end), (start, middle)]  # the first half is tried first
        else:
            cur.execute("RELEASE SAVEPOINT tally_poison")
    return refused
