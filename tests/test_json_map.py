"""`--transform json` against the real PostgreSQL: the table's own types decide each conversion; every bad
value becomes a dead letter that names its column, source and value, and the good rows land."""
import json
import re
from decimal import Decimal

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine import commit, db, json_map, sinks
from consumers.engine.transforms import BadRecord, SourceRecord, for_pipeline
from consumers.models import DeadLetter, PartitionOffset, Pipeline

TYPES_TABLE = "jm_types"
TYPES_DDL = """
CREATE TABLE jm_types (
    small smallint, regular integer, big bigint, amount numeric(8,2), ratio double precision,
    label varchar(5), note text, flag boolean, at timestamptz, local_at timestamp, day date, uid uuid,
    doc jsonb, address inet,
    must bigint NOT NULL, defaulted text NOT NULL DEFAULT 'd',
    source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (source_topic, source_partition, source_offset))
"""


def record(value, offset=0, key=None, timestamp_ms=1_700_000_000_000, headers=()):
    raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return SourceRecord(0, offset, key, raw, timestamp_ms, headers)


@pytest.fixture
def types_table(transactional_db):
    with connection.cursor() as cur:
        cur.execute(TYPES_DDL)
    yield TYPES_TABLE
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS jm_types")


@pytest.fixture
def column_table(transactional_db):
    """column_table(name, columns): a table of `columns` (SQL) and the provenance columns, dropped afterwards."""
    made = []

    def make(name: str, columns: str) -> str:
        with connection.cursor() as cur:
            cur.execute(sql.SQL("CREATE TABLE {} ({}, source_topic text NOT NULL, source_partition integer NOT NULL, "
                                "source_offset bigint NOT NULL)").format(sql.Identifier(name), sql.SQL(columns)))
        made.append(name)
        return name
    yield make
    with connection.cursor() as cur:
        for name in made:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def compiled(table, mapping=None):
    with connection.cursor() as cur:
        return json_map.plan_for_table(cur.cursor, table, mapping or {}).transform()


def test_the_plan_reads_types_precision_and_nullability_from_the_catalog(types_table):
    with connection.cursor() as cur:
        columns = {c.name: c for c in json_map.read_columns(cur.cursor, types_table)}
    assert (columns["amount"].base, columns["amount"].precision, columns["amount"].scale) == ("numeric", 8, 2)
    assert (columns["label"].base, columns["label"].length) == ("varchar", 5)
    assert columns["must"].required and not columns["defaulted"].required and columns["note"].nullable
    plan = json_map.plan(list(columns.values()), {})
    # Provenance columns are Tally's; defaulted columns keep their default unless a --map names them.
    assert "source_offset" not in plan.column_names and "defaulted" not in plan.column_names
    assert "written_at" not in plan.column_names and "must" in plan.column_names
    assert "defaulted" in json_map.plan(list(columns.values()), {"defaulted": "d"}).column_names


GOOD = [
    ("small", 32767, 32767), ("small", "-12", -12), ("regular", 2 ** 31 - 1, 2 ** 31 - 1),
    ("big", 2 ** 63 - 1, 2 ** 63 - 1), ("big", 5.0, 5),
    ("amount", 19.99, 19.99),  # a float that fits goes to COPY as itself
    ("amount", "123456.785", "123456.79"), ("amount", 7, "7"),
    ("ratio", 0.5, "0.5"), ("label", "abcde", "abcde"), ("note", 12, "12"), ("note", {"a": 1}, '{"a": 1}'),
    ("label", "abc    ", "abc  "),  # PostgreSQL cuts spaces beyond varchar(5) and refuses nothing else
    ("flag", True, "t"), ("flag", "false", "f"),
    ("at", "2024-05-01T12:30:00+02:00", "2024-05-01T12:30:00+02:00"),
    ("at", "2024-05-01T10:30:00Z", "2024-05-01T10:30:00Z"),
    ("at", 1_714_559_400_000, "2024-05-01T10:30:00+00:00"), ("local_at", "2024-05-01T12:30:00+02:00",
                                                            "2024-05-01T10:30:00"),
    ("day", "2024-05-01", "2024-05-01"), ("day", 1_714_559_400_000, "2024-05-01"),
    # Finer than a microsecond: rounded as PostgreSQL rounds it, not cut.
    ("at", "2024-05-01T10:30:00.1234567Z", "2024-05-01T10:30:00.123457+00:00"),
    ("local_at", "2024-05-01T10:30:59.9999996", "2024-05-01T10:31:00"),
    ("uid", "6F9619FF-8B86-D011-B42D-00C04FC964FF", "6f9619ff-8b86-d011-b42d-00c04fc964ff"),
    ("doc", {"items": [1, 2]}, '{"items":[1,2]}'), ("doc", [1, "x"], '[1,"x"]'),
    ("address", "10.0.0.1", "10.0.0.1"), ("note", None, None),
]


@pytest.mark.parametrize(("column", "value", "expected"), GOOD)
def test_a_good_value_converts_to_what_its_column_takes(types_table, column, value, expected):
    transform = compiled(types_table)
    row = transform.rows(record({"must": 1, column: value}))[0]
    assert row[[name for name, _ in transform.columns].index(column)] == expected


BAD = [
    ("small", 32768, "out of range"), ("regular", -2 ** 31 - 1, "out of range"), ("big", 2 ** 63, "out of range"),
    ("big", 1.5, "not an integer"), ("big", True, "not an integer"), ("big", "12a", "not an integer"),
    # Digits of other scripts and underscores: Python reads them as numbers, PostgreSQL refuses them.
    ("big", "\u0661\u0662", "not an integer"), ("amount", "\u0661\u0662", "not a number"),
    ("amount", "1_000", "not a number"), ("ratio", "\u0661\u0662", "not a number"), ("ratio", "1_0", "not a number"),
    ("amount", 1_000_000, "too many digits"), ("amount", "abc", "not a number"), ("amount", "NaN", "finite"),
    ("ratio", "fast", "not a number"), ("label", "abcdef", "longer than"), ("note", "a\x00b", "NUL"),
    ("note", "\ud800", "surrogate"), ("flag", "yes", "not a boolean"), ("flag", 1, "not a boolean"),
    ("at", "yesterday", "ISO-8601"), ("at", [1], "ISO-8601"), ("at", 10 ** 20, "out of range"),
    ("day", "2024-13-01", "ISO-8601 date"), ("uid", "not-a-uuid", "not a UUID"), ("uid", 5, "not a UUID"),
    ("doc", "a\x00", "\\u0000"), ("doc", float("inf"), "NaN or Infinity"),
    ("doc", {"x": [1, float("nan")]}, "NaN or Infinity"), ("must", None, "NOT NULL"),
]


@pytest.mark.parametrize(("column", "value", "reason"), BAD)
def test_a_bad_value_is_a_bad_record_naming_its_column_source_and_value(types_table, column, value, reason):
    transform = compiled(types_table)
    fields = {"must": 1, column: value}
    with pytest.raises(BadRecord) as caught:
        transform.rows(record(fields))
    message = str(caught.value)
    assert message.startswith(f"column {column} (from {column}): ") and reason in message
    if value is not None:
        assert repr(value if isinstance(value, str) else json.dumps(value))[:20] in message


# Values the generated row function takes inline (its common case) and values it hands to the converter, beside
# each other: what PostgreSQL stores must not depend on which path a value took.
AGREEING = [
    ("small", [0, -32768, 32767, 7.0, "12"]), ("big", [2 ** 63 - 1, -2 ** 63, 5.0, " 42"]),
    ("amount", [0.125, 2.675, -0.005, 1.005, 999998.994, 999999.994, 1e-05, -0.0, 7, -999999, "3.14159", 12.5]),
    ("label", ["abcde", "ab\tc", "é", "日本", "a\\b", 12, "abcde   "]),
    ("note", ["plain", "line\nbreak", "ünï", {"a": [1, 2]}, 3.5]),
    ("flag", [True, False, "true", "false"]),
    ("at", ["2024-05-01T12:30:00+02:00", "2024-05-01T10:30:00Z", "2024-05-01T10:30:00.123456Z",
            "2024-05-01 10:30:00-05:30", "2024-05-01T10:30:00", 1_714_559_400_000]),
    ("doc", [{"items": [1, 2]}, [1, "x"], "text", 1.5, {"nested": {"é": None}}, 2 ** 70]),
]


@pytest.mark.parametrize(("column", "values"), AGREEING)
def test_the_generated_row_and_the_column_converter_store_the_same_values(types_table, column, values):
    transform = compiled(types_table)
    names = [name for name, _ in transform.columns]
    plan = json_map.plan(json_map.read_columns(connection.cursor().cursor, types_table), {})
    finish = json_map._finish(next(w for w in plan.columns if w.column.name == column))
    inline = [transform.rows(record({"must": 1, column: value}))[0][names.index(column)] for value in values]
    converted = [finish(json.loads(json.dumps(value))) for value in values]
    stored = []
    with connection.cursor() as cur:
        for partition, cells in enumerate((inline, converted)):
            sinks.copy_rows(cur.cursor, types_table,
                            [column, "must", "source_topic", "source_partition", "source_offset"],
                            [(cell, 1, "t", partition, i) for i, cell in enumerate(cells)])
            cur.execute(sql.SQL("SELECT {}::text FROM {} WHERE source_partition = %s ORDER BY source_offset").format(
                sql.Identifier(column), sql.Identifier(types_table)), [partition])
            stored.append([r[0] for r in cur.fetchall()])
    assert stored[0] == stored[1] and len(stored[0]) == len(values)


def test_a_numeric_with_a_negative_scale_rounds_as_postgresql_does(column_table):
    # numeric(2,-3) was read as scale 2045: every value failed with decimal.InvalidOperation (a dead letter).
    transform = compiled(column_table("jm_thousands", "n numeric(2,-3)"))
    rows = [transform.rows(record({"n": value}, offset))[0] + ("t", 0, offset)
            for offset, value in enumerate([12345, 12345.6, "12500", -499])]
    with pytest.raises(BadRecord, match=r"too many digits for numeric\(2,-3\)"):
        transform.rows(record({"n": "123456"}))
    with connection.cursor() as cur:
        sinks.copy_rows(cur.cursor, "jm_thousands", ["n", "source_topic", "source_partition", "source_offset"], rows)
        cur.execute("SELECT n::text FROM jm_thousands ORDER BY source_offset")
        assert [n for (n,) in cur.fetchall()] == ["12000", "12000", "13000", "0"]


def test_a_numeric_wider_than_28_digits_takes_its_values(column_table):
    # Rounding to the scale ran in Python's default 28-digit context: a uint256 into numeric(78,0) failed with an
    # opaque decimal.InvalidOperation (a dead letter PostgreSQL would have written), as did 1e30 into numeric(8,2).
    transform = compiled(column_table("jm_wide", "wei numeric(78,0), amount numeric(8,2)"))
    uint256 = str(2 ** 256 - 1)
    assert transform.rows(record({"wei": uint256}))[0][0] == uint256
    assert transform.rows(record({"wei": "12345678901234567890123456789.5"}))[0][0] == (
        "12345678901234567890123456790")
    for too_long in (1e30, "1e30", "1e5000"):
        with pytest.raises(BadRecord, match=r"column amount \(from amount\): too many digits for numeric"):
            transform.rows(record({"amount": too_long}))


def test_a_date_column_takes_the_date_written_in_a_timestamp_as_postgresql_reads_it(types_table):
    # A timestamp with an offset went to its UTC date: 23:30 at -05:00 on January 1 was stored as January 2.
    transform = compiled(types_table)
    day = [name for name, _ in transform.columns].index("day")
    texts = ["2024-01-01T23:30:00-05:00", "2024-01-01T00:30:00+05:30", "2024-01-01 23:30:00Z",
             "2024-01-01T23:59:59.9999999", "2024-01-01T12:00:00"]
    with connection.cursor() as cur:
        for text in texts:
            cur.execute("SELECT %s::date::text", [text])
            stored = transform.rows(record({"must": 1, "day": text}))[0][day]
            assert stored == cur.fetchone()[0] == "2024-01-01", text


@pytest.fixture
def domains(transactional_db):
    with connection.cursor() as cur:
        cur.execute("CREATE DOMAIN jm_status AS text DEFAULT 'new'; "
                    "CREATE DOMAIN jm_rank AS integer NOT NULL DEFAULT 9; "
                    "CREATE DOMAIN jm_positive AS integer CHECK (VALUE > 0)")
    yield
    with connection.cursor() as cur:
        cur.execute("DROP DOMAIN IF EXISTS jm_status, jm_rank, jm_positive CASCADE")


def test_a_domains_default_fills_its_column_and_its_check_makes_a_dead_letter(domains, column_table):
    # A domain's DEFAULT was not read as a default: the column was written NULL (jm_status), or every record
    # was a dead letter "missing, and the column is NOT NULL" (jm_rank), where PostgreSQL fills in the default.
    table = column_table("jm_domains", "id bigint NOT NULL, status jm_status, rank jm_rank, qty jm_positive")
    pipeline = Pipeline.objects.create(name="jm", topic="orders", sink_table=table, transform="json", epoch=1)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        outcome = commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1, {0: [
            record({"id": 1}, 0), record({"id": 2, "qty": 3}, 1), record({"id": 3, "qty": -5}, 2)]})[0]
    finally:
        conn.close()
    assert (outcome.rows_written, outcome.dead_letters) == (2, 1)
    with connection.cursor() as cur:
        cur.execute("SELECT id, status, rank, qty FROM jm_domains ORDER BY id")
        assert cur.fetchall() == [(1, "new", 9, None), (2, "new", 9, 3)]
    error = DeadLetter.objects.get(pipeline=pipeline).error
    assert 'violates check constraint "jm_positive_check"' in error and "column qty" in error


def test_a_domain_over_a_domain_is_read_as_its_innermost_base_type(column_table):
    # Only the outer domain was resolved: the column's base was the inner domain, so the mapping gave its text to
    # PostgreSQL, which refused 5.0 for integer (a dead letter), and a varchar(3) under two domains lost its length.
    with connection.cursor() as cur:
        cur.execute("CREATE DOMAIN jm_inner AS integer NOT NULL; CREATE DOMAIN jm_outer AS jm_inner; "
                    "CREATE DOMAIN jm_code_inner AS varchar(3); CREATE DOMAIN jm_code AS jm_code_inner")
    try:
        table = column_table("jm_nested", "plain integer, nested jm_outer, code jm_code")
        with connection.cursor() as cur:
            columns = {c.name: c for c in json_map.read_columns(cur.cursor, table)}
        assert (columns["nested"].base, columns["nested"].required) == ("int4", True)
        assert (columns["code"].base, columns["code"].length) == ("varchar", 3)
        transform = compiled(table)
        assert transform.rows(record({"plain": 5.0, "nested": 5.0, "code": "ab"}))[0] == (5, 5, "ab")
        with pytest.raises(BadRecord, match="longer than"):
            transform.rows(record({"nested": 1, "code": "abcd"}))
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS jm_nested; DROP DOMAIN IF EXISTS jm_code, jm_code_inner, jm_outer, "
                        "jm_inner")


def test_a_json_array_fills_an_array_column_each_element_converted_as_its_type(column_table):
    # A JSON array went to PostgreSQL as its JSON text ("[1, 2]"): every record was a dead letter, "malformed array
    # literal", where a user expects the array.
    transform = compiled(column_table("jm_arrays", "tags text[], counts integer[], prices numeric(6,2)[], "
                                      "codes varchar(3)[], docs jsonb[], grid integer[]"))
    fields = {"tags": ["a", "b c", None, "x,y", 'q"r', "NULL", "back\\slash"], "counts": [1, 2.0, "3"],
              "prices": [19.999, "5"], "codes": ["abc", "de  "], "docs": [{"a": [1]}, [2], "s", None],
              "grid": [[1, 2], [3, 4]]}
    rows = [transform.rows(record(fields, 0))[0] + ("t", 0, 0),
            transform.rows(record({"tags": "{x,y}", "counts": []}, 1))[0] + ("t", 0, 1)]
    with connection.cursor() as cur:
        sinks.copy_rows(cur.cursor, "jm_arrays", [name for name, _ in transform.columns] +
                        ["source_topic", "source_partition", "source_offset"], rows)
        cur.execute("SELECT tags, counts, prices::text[], codes, docs::text[], grid FROM jm_arrays "
                    "ORDER BY source_offset")
        assert cur.fetchall() == [
            (["a", "b c", None, "x,y", 'q"r', "NULL", "back\\slash"], [1, 2, 3], ["20.00", "5.00"], ["abc", "de "],
             ['{"a": [1]}', "[2]", '"s"', None], [[1, 2], [3, 4]]),
            (["x", "y"], [], None, None, None, None)]
    for column, value, reason in [("counts", [1, "x"], "element 1: not an integer for integer"),
                                  ("grid", [[1], [2, 2 ** 40]], "element 1.1: out of range for integer"),
                                  ("codes", ["abcd"], "element 0: longer than character varying(3)"),
                                  ("counts", 5, "not an array for integer[]")]:
        with pytest.raises(BadRecord, match=rf"column {column} \(from {column}\): {re.escape(reason)}"):
            transform.rows(record({column: value}))


def test_a_long_number_is_read_as_a_float_only_where_the_float_is_that_number():
    # A float's shortest text (what most producers write) stays on orjson's fast path; a longer one is a Decimal.
    doc = json_map.loads(b'{"f": 0.30000000000000004, "g": -1234.5678901234567, "d": 0.12345678901234567890123,'
                         b' "i": 123456789012345678901, "when": "2024.05.01.12.30.00.123"}')
    assert (type(doc["f"]), type(doc["g"]), doc["d"], doc["i"]) == (float, float, Decimal("0.12345678901234567890123"),
                                                                    123456789012345678901)
    assert doc["when"] == "2024.05.01.12.30.00.123"
    assert json_map._orjson_exact(b'{"f": 0.30000000000000004, "n": 123456789012345678}')
    assert not json_map._orjson_exact(b'{"f": 1.000000000000000001}')


def test_a_number_a_float_cannot_hold_is_written_as_written_or_refused(types_table):
    # orjson reads every number with a fraction as a float: more than 15 significant digits were silently rounded
    # (in numeric, bigint, jsonb and text columns alike), and a number beyond a double's range became Infinity.
    transform = compiled(types_table)
    names = [name for name, _ in transform.columns]
    row = dict(zip(names, transform.rows(record(
        b'{"must": 12345678901234567.0, "big": 9007199254740993.0, "amount": 0.004999999999999999999,'
        b' "note": 1.000000000000000001, "doc": {"x": 0.12345678901234567890123, "y": [1.5, 2]}}'))[0], strict=True))
    assert (row["must"], row["big"], row["amount"], row["note"]) == (
        12345678901234567, 9007199254740993, "0.00", "1.000000000000000001")
    assert row["doc"] == '{"x":0.12345678901234567890123,"y":[1.5,2]}'
    for value in (b"1e400", b"-1e400", b'"1e400"', b"1" + b"0" * 400, b'"1e-400"'):
        with pytest.raises(BadRecord, match=r"column ratio \(from ratio\): out of range for double precision"):
            transform.rows(record(b'{"must": 1, "ratio": ' + value + b"}"))
    assert transform.rows(record(b'{"must": 1, "ratio": "-Infinity"}'))[0][names.index("ratio")] == "-inf"


def test_a_missing_field_for_a_not_null_column_and_a_value_that_is_not_json_are_bad_records(types_table):
    transform = compiled(types_table)
    with pytest.raises(BadRecord, match=r"column must \(from must\): missing, and the column is NOT NULL"):
        transform.rows(record({"note": "x"}))
    with pytest.raises(BadRecord, match="not JSON"):
        transform.rows(record(b"{oops"))
    with pytest.raises(BadRecord, match="not an object"):
        transform.rows(record([1, 2]))
    with pytest.raises(BadRecord, match="tombstone"):
        transform.rows(record(None))


def test_a_long_value_is_cut_short_in_the_error(types_table):
    with pytest.raises(BadRecord) as caught:
        compiled(types_table).rows(record({"must": 1, "at": "x" * 500}))
    assert "x" * json_map.SHOWN_VALUE_CHARS + "..." in str(caught.value) and "x" * 100 not in str(caught.value)


def test_map_sources_take_paths_array_elements_and_the_records_own_fields(types_table):
    transform = compiled(types_table, {"note": "customer.name", "label": "items.1.sku", "big": "@offset",
                                       "small": "@partition", "at": "@timestamp", "regular": "@key",
                                       "defaulted": "@header:origin", "must": "id"})
    names = [name for name, _ in transform.columns]
    row = transform.rows(SourceRecord(3, 41, b"77", json.dumps(
        {"id": 9, "customer": {"name": "Ada"}, "items": [{"sku": "a"}, {"sku": "b"}], "big": 5}).encode(),
        1_714_559_400_000, [("origin", b"web")]))[0]
    got = dict(zip(names, row, strict=True))
    assert got["note"] == "Ada" and got["label"] == "b" and got["big"] == 41 and got["small"] == 3
    assert got["at"] == "2024-05-01T10:30:00+00:00" and got["regular"] == 77 and got["defaulted"] == "web"
    assert got["must"] == 9
    # A path that reaches past the data is missing: NULL where the column allows it.
    row = transform.rows(SourceRecord(0, 1, b"1", b'{"id": 1, "items": []}', None, [("origin", b"x")]))[0]
    assert dict(zip(names, row, strict=True))["label"] is None


def test_an_unmapped_column_takes_the_top_level_field_of_its_name_even_with_a_dot(column_table):
    # The column's name was read as a source: "user.id" as the path user -> id (NULL, silently), "x." refused to
    # compile at all.
    transform = compiled(column_table("jm_dots", '"user.id" bigint, "x." text, "@key" text'))
    assert transform.rows(record({"user.id": 5, "user": {"id": 6}, "x.": "y", "@key": "z"}, key=b"k")) == (
        (5, "y", "z"),)


def test_a_key_or_header_that_is_not_utf8_is_a_bad_record_not_replacement_characters(types_table):
    transform = compiled(types_table, {"note": "@key", "label": "@header:origin", "must": "id"})
    with pytest.raises(BadRecord, match=r"the key is not UTF-8 text: '\\\\xffab'"):
        transform.rows(record({"id": 1}, key=b"\xffab"))
    with pytest.raises(BadRecord, match="header 'origin' is not UTF-8 text"):
        transform.rows(record({"id": 1}, key=b"k", headers=[("origin", b"\xc3\x28")]))


def test_a_json_column_takes_the_nul_escape_that_jsonb_refuses(types_table):
    with connection.cursor() as cur:
        cur.execute("ALTER TABLE jm_types ADD COLUMN plain json")
    transform = compiled(types_table)
    names = [name for name, _ in transform.columns]
    row = transform.rows(record({"must": 1, "plain": {"a": "x\u0000y"}}))[0]
    assert row[names.index("plain")] == '{"a":"x\\u0000y"}'
    with connection.cursor() as cur:  # and PostgreSQL takes it
        sinks.copy_rows(cur.cursor, types_table, [*names, "source_topic", "source_partition", "source_offset"],
                        [(*row, "t", 0, 0)])
        cur.execute("SELECT plain::text FROM jm_types")
        assert cur.fetchone() == ('{"a":"x\\u0000y"}',)


def test_a_mapping_that_cannot_work_is_refused_with_every_problem(types_table):
    with connection.cursor() as cur, pytest.raises(json_map.MappingInvalid) as caught:
        json_map.plan_for_table(cur.cursor, types_table, {"nope": "x", "source_offset": "id", "note": "@when",
                                                          "label": "a..b"})
    text = str(caught.value)
    assert "no column 'nope'" in text and "provenance" in text and "unknown source '@when'" in text
    assert "empty step" in text


def test_parse_map_options_refuses_what_is_not_column_equals_source():
    assert json_map.parse_map_options(["order_id=id", "name = customer.name"]) == {
        "order_id": "id", "name": "customer.name"}
    for bad in (["order_id"], ["=id"], ["a=b", "a=c"]):
        with pytest.raises(ValueError):
            json_map.parse_map_options(bad)


@pytest.fixture
def json_pipeline(types_table):
    pipeline = Pipeline.objects.create(name="jm", topic="orders", sink_table=types_table, transform="json",
                                       json_map={"must": "id"}, epoch=1)
    conn = db.connect()
    yield pipeline, conn
    conn.close()


def test_the_commit_protocol_writes_typed_rows_and_dead_letters_bad_records_in_one_batch(json_pipeline):
    pipeline, conn = json_pipeline
    target = commit.Target.for_pipeline(pipeline)
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    batch = [record({"id": 1, "amount": "12.5", "at": "2024-05-01T10:30:00Z", "doc": {"a": [1]}}, 0),
             record({"id": 2, "small": 99999}, 1),
             record(b"not json", 2),
             record({"id": 3, "flag": False, "day": "2024-02-29", "uid": None}, 3)]
    outcomes = commit.commit_batch(conn, target, 1, {0: batch})
    assert (outcomes[0].rows_written, outcomes[0].dead_letters) == (2, 2)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT must, amount::text, at, doc, flag, day::text, defaulted, source_offset FROM {} "
                            "ORDER BY must").format(sql.Identifier(pipeline.sink_table)))
        rows = cur.fetchall()
    assert [(r[0], r[1], r[4], r[5], r[6], r[7]) for r in rows] == [
        (1, "12.50", None, None, "d", 0), (3, None, False, "2024-02-29", "d", 3)]
    assert rows[0][2].isoformat() == "2024-05-01T10:30:00+00:00" and rows[0][3] in ({"a": [1]}, '{"a": [1]}')
    errors = dict(DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", "error"))
    assert "column small (from small): out of range for smallint: '99999'" in errors[1]
    assert "not JSON" in errors[2]


def test_for_pipeline_compiles_the_stored_mapping_once_from_the_table(json_pipeline):
    pipeline, _ = json_pipeline
    transform = for_pipeline(pipeline)
    assert transform.name == "json" and ("must", "bigint") in transform.columns


def test_a_replay_into_a_table_whose_own_id_is_an_identity_writes_the_records_it_lacks(column_table):
    # A replay after a rewind that kept the sink goes through a staging copy of the table, which kept the identity's
    # NOT NULL without its sequence: every replayed record became a dead letter, though the first pass wrote them.
    table = column_table("jm_identity", "id bigint GENERATED ALWAYS AS IDENTITY, n integer")
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ADD UNIQUE (source_topic, source_partition, source_offset)").format(
            sql.Identifier(table)))
    pipeline = Pipeline.objects.create(name="jm", topic="orders", sink_table=table, transform="json", epoch=1)
    conn = db.connect()
    try:
        target = commit.Target.for_pipeline(pipeline)
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        commit.commit_batch(conn, target, 1, {0: [record({"n": 0}, 0), record({"n": 1}, 1)]})
        PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=0, replay_until=2)
        [outcome] = commit.commit_batch(conn, target, 1, {0: [record({"n": n}, n) for n in range(3)]})
    finally:
        conn.close()
    assert outcome.dead_letters == 0 and not DeadLetter.objects.exists()
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT id, n, source_offset FROM {} ORDER BY source_offset").format(sql.Identifier(table)))
        assert [(n, offset) for _, n, offset in cur.fetchall()] == [(0, 0), (1, 1), (2, 2)]


# A number written into a timestamp, timestamptz or date column counts epoch milliseconds unless its source names
# another unit (SOURCE::UNIT): 1714559400 read as milliseconds is a day in January 1970, silently.
EPOCH_UNITS = [
    ("at", "stamp", 1_714_559_400_000, "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::milliseconds", 1_714_559_400_000, "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::seconds", 1_714_559_400, "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::seconds", 1_714_559_400.25, "2024-05-01T10:30:00.250000+00:00"),
    ("at", "stamp::seconds", 1_714_559_400.123456, "2024-05-01T10:30:00.123456+00:00"),  # time.time() in Python
    ("at", "stamp::seconds", -86_400, "1969-12-31T00:00:00+00:00"),
    ("at", "stamp::microseconds", 1_714_559_400_123_456, "2024-05-01T10:30:00.123456+00:00"),
    # Finer than a microsecond: rounded half to even, as PostgreSQL rounds a finer fraction.
    ("at", "stamp::nanoseconds", 1_714_559_400_123_456_500, "2024-05-01T10:30:00.123456+00:00"),
    ("at", "stamp::nanoseconds", 1_714_559_400_123_457_500, "2024-05-01T10:30:00.123458+00:00"),
    ("at", "meta.stamp::seconds", 1_714_559_400, "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::seconds", "2024-05-01T12:30:00+02:00", "2024-05-01T12:30:00+02:00"),  # text stays ISO-8601
    ("local_at", "stamp::seconds", 1_714_559_400, "2024-05-01T10:30:00"),
    ("day", "stamp::seconds", 1_714_559_400, "2024-05-01"),
    # Naming the unit says the field is an epoch number: digits written as text are read as that number.
    ("at", "stamp::seconds", "1714559400", "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::seconds", "1714559400.25", "2024-05-01T10:30:00.250000+00:00"),
    ("at", "stamp::milliseconds", "1714559400000", "2024-05-01T10:30:00+00:00"),
    ("at", "stamp::nanoseconds", "1714559400123456500", "2024-05-01T10:30:00.123456+00:00"),
    ("local_at", "stamp::seconds", "-86400", "1969-12-31T00:00:00"),
    ("day", "stamp::seconds", "1714559400", "2024-05-01"),
    ("day", "stamp::seconds", "20240501", "1970-08-23"),  # digits under a unit are epoch, never a compact date
    ("day", "stamp", "20240501", "2024-05-01"),            # without one, as before: the date written
]


@pytest.mark.parametrize(("column", "source", "value", "expected"), EPOCH_UNITS)
def test_a_number_into_a_timestamp_counts_the_unit_its_source_names(types_table, column, source, value, expected):
    transform = compiled(types_table, {column: source, "must": "id"})
    path = source.partition("::")[0].split(".")
    fields = {"id": 1, path[0]: value if len(path) == 1 else {path[1]: value}}
    row = transform.rows(record(fields))[0]
    assert row[[name for name, _ in transform.columns].index(column)] == expected


@pytest.mark.parametrize(("source", "value", "reason"), [
    ("stamp::seconds", 1_714_559_400_000, "epoch seconds out of range"),  # milliseconds read as seconds: year 56300
    ("stamp::microseconds", 1.5, "not a whole number of epoch microseconds"),
    ("stamp::milliseconds", 1.5, "epoch milliseconds"),
    ("stamp::seconds", "12abc", "not an ISO-8601 timestamp, nor epoch seconds written as digits"),
    ("stamp::seconds", "1.7e9", "not an ISO-8601 timestamp, nor epoch seconds written as digits"),
    ("stamp::seconds", "", "not an ISO-8601 timestamp, nor epoch seconds written as digits"),
    ("stamp::seconds", "1714559400000", "epoch seconds out of range"),   # text is checked as the number is
    ("stamp::microseconds", "1.5", "not a whole number of epoch microseconds"),
    # Without a unit, digits in text stay refused (as before), and the reason says how to read them.
    ("stamp", "1714559400000", "epoch milliseconds written as text are read only when the source names its unit "
                               "(SOURCE::milliseconds, ::seconds, ...)"),
    ("stamp::seconds", True, "not an ISO-8601 timestamp or epoch seconds"),
    ("stamp::seconds", 1e300, "epoch seconds out of range"),
])
def test_a_number_its_unit_cannot_read_is_a_bad_record_naming_the_unit(types_table, source, value, reason):
    transform = compiled(types_table, {"at": source, "must": "id"})
    with pytest.raises(BadRecord) as caught:
        transform.rows(record({"id": 1, "stamp": value}))
    assert str(caught.value).startswith(f"column at (from {source}): ") and reason in str(caught.value)


def test_an_array_of_timestamps_reads_its_numbers_in_the_unit(column_table):
    transform = compiled(column_table("jm_stamps", "seen timestamptz[]"), {"seen": "seen::seconds"})
    assert transform.rows(record({"seen": [1_714_559_400, None, "1714559401"]})) == (
        ('{"2024-05-01T10:30:00+00:00",NULL,"2024-05-01T10:30:01+00:00"}',),)


def test_a_unit_that_is_unknown_or_on_a_column_or_source_that_is_no_epoch_number_is_refused(types_table):
    with connection.cursor() as cur, pytest.raises(json_map.MappingInvalid) as caught:
        json_map.plan_for_table(cur.cursor, types_table, {
            "at": "stamp::fortnights", "big": "n::seconds", "local_at": "@timestamp::seconds",
            "day": "@header:sent::seconds", "must": "id"})
    text = str(caught.value)
    assert "--map at=stamp::fortnights: unknown unit 'fortnights'" in text and "::seconds" in text
    assert "--map big=n::seconds: a unit reads a number as an epoch time" in text and "bigint" in text
    assert "--map local_at=@timestamp::seconds: " in text and "--map day=@header:sent::seconds: " in text
    # The same mapping without its units compiles: each refusal was the unit's.
    with connection.cursor() as cur:
        json_map.plan_for_table(cur.cursor, types_table, {"at": "stamp", "big": "n", "local_at": "@timestamp",
                                                          "day": "@header:sent", "must": "id"})


def test_the_commit_protocol_writes_epoch_seconds_as_their_instant(json_pipeline):
    pipeline, conn = json_pipeline
    pipeline.json_map = {"must": "id", "at": "sent::seconds"}
    pipeline.save(update_fields=["json_map"])
    commit.ensure_positions(conn, pipeline.pk, {0: 0})
    outcomes = commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1, {0: [
        record({"id": 1, "sent": 1_764_288_000}, 0), record({"id": 2, "sent": 1_764_288_000_000}, 1),
        record({"id": 3, "sent": "1764288000"}, 2), record({"id": 4, "sent": "12abc"}, 3)]})
    assert (outcomes[0].rows_written, outcomes[0].dead_letters) == (2, 2)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT must, at FROM {} ORDER BY must").format(sql.Identifier(pipeline.sink_table)))
        assert [(must, at.isoformat()) for must, at in cur.fetchall()] == [(1, "2025-11-28T00:00:00+00:00"),
                                                                           (3, "2025-11-28T00:00:00+00:00")]
    assert "epoch seconds out of range" in DeadLetter.objects.get(pipeline=pipeline, offset=1).error
    assert DeadLetter.objects.get(pipeline=pipeline, offset=3).error.endswith(
        "column at (from sent::seconds): not an ISO-8601 timestamp, nor epoch seconds written as digits: '12abc'")


@pytest.mark.timeout(600)   # a guard against the hang itself: without the check each conversion takes about an hour
@pytest.mark.parametrize("column", ["small", "big", "at", "day"])
def test_a_short_number_with_a_huge_exponent_is_refused_at_once_not_converted_digit_by_digit(types_table, column):
    """`1e10000000` is 10 bytes; int() of its Decimal builds all ten million digits (quadratic: an hour), so the
    pipeline hung on it, and on it again after every restart, instead of dead-lettering it."""
    transform = compiled(types_table)
    with pytest.raises(BadRecord, match=rf"column {column} \(from {column}\): .*out of range"):
        transform.rows(record(b'{"must": 1, "%s": 1e10000000}' % column.encode()))


def test_a_numeric_without_precision_refuses_what_postgresql_numeric_cannot_hold(column_table):
    """Written out, 1e100000000 was a 100 MB value for the COPY (sent again at every split of the batch)."""
    transform = compiled(column_table("jm_wide", "n numeric"))
    for value in (b"1e100000000", b"-1e131072", b"1e-16384"):
        with pytest.raises(BadRecord, match=r"column n \(from n\): out of range for numeric"):
            transform.rows(record(b'{"n": ' + value + b"}"))
    assert transform.rows(record(b'{"n": 1e-400}'))[0][0] == "0." + "0" * 399 + "1"


def test_a_number_too_small_for_a_float_is_kept_or_refused_whatever_else_the_record_holds(types_table):
    """orjson reads 1e-400 as 0.0: a float, numeric or jsonb column stored 0 on its fast path, and refused it or kept
    it exactly when another field (a NaN, a long number) sent the record to json.loads."""
    transform = compiled(types_table)
    names = [name for name, _ in transform.columns]
    for other in (b"", b', "note": NaN'):
        row = dict(zip(names, transform.rows(record(b'{"must": 1, "doc": {"x": 1e-400}' + other + b"}"))[0],
                       strict=True))
        assert row["doc"] == '{"x":1E-400}'
        with pytest.raises(BadRecord, match=r"column ratio \(from ratio\): out of range for double precision"):
            transform.rows(record(b'{"must": 1, "ratio": 1e-400' + other + b"}"))
