"""The COPY text encoder of the sinks, round-tripped through the real PostgreSQL: what goes in comes back."""
import psycopg2
import pytest
from django.db import connection

from consumers.engine.sinks import copy_buffer, copy_rows

COLUMNS = ["body", "flag", "amount", "source_offset"]
AWKWARD = [
    "back\\slash", "\\N", "\\\\N", "tab\there", "new\nline", "carriage\rreturn", "crlf\r\n", "\\t literal",
    "trailing backslash\\", "emoji 😀 and 𝄞 outside the BMP", "ünïcödé ✓", "", " ", "None", "True", "False",
    "a\tb\nc\\d\re 😀",
]


@pytest.fixture
def table(db):
    with connection.cursor() as cur:
        cur.execute("CREATE TEMP TABLE copy_roundtrip (body text, flag boolean, amount double precision, "
                    "source_offset bigint)")
    return "copy_roundtrip"


def raw_cursor():
    """psycopg2's own cursor (the engine's kind) inside the test's transaction."""
    connection.ensure_connection()
    return connection.connection.cursor()


def round_trip(table, rows):
    with raw_cursor() as cur:
        copy_rows(cur, table, COLUMNS, rows)
        cur.execute("SELECT body, flag, amount, source_offset FROM copy_roundtrip ORDER BY source_offset")
        return [tuple(row) for row in cur.fetchall()]


def test_awkward_text_comes_back_unchanged(table):
    rows = [(text, None, None, offset) for offset, text in enumerate(AWKWARD)]
    assert round_trip(table, rows) == rows


def test_none_booleans_and_numbers_keep_their_meaning(table):
    rows = [(None, True, 1.5, 0), ("x", False, -0.25, 1), (None, None, 1e300, 2), ("None", None, 0.0, 3)]
    assert round_trip(table, rows) == rows


def test_plain_rows_take_the_fast_path_and_still_round_trip(table):
    rows = [(f"row {i}", i % 2 == 0, float(i), i) for i in range(1000)]
    assert round_trip(table, rows) == rows


def test_one_awkward_field_among_plain_rows_is_escaped(table):
    rows = [(f"row {i}", None, None, i) for i in range(100)] + [("tab\tand\\slash\n", None, None, 100)]
    assert round_trip(table, rows) == rows


def test_the_encoding_escapes_exactly_the_special_characters():
    text = copy_buffer([("a\\b\tc\nd\re", None, True, 7)]).getvalue()
    assert text == "a\\\\b\\tc\\nd\\re\t\\N\tt\t7\n"


def test_nul_cannot_be_stored_in_a_text_column_and_fails_clearly(table):
    # PostgreSQL text holds no NUL character: the COPY is refused with an error that names it, nothing is written.
    with pytest.raises(psycopg2.DataError, match="0x00"):
        with connection.cursor() as cur, raw_cursor() as raw:
            raw.execute("SAVEPOINT before_copy")
            try:
                copy_rows(raw, table, COLUMNS, [("ok", None, None, 0), ("nul\x00inside", None, None, 1)])
            finally:
                raw.execute("ROLLBACK TO SAVEPOINT before_copy")
                cur.execute("SELECT count(*) FROM copy_roundtrip")
                assert cur.fetchone()[0] == 0
