"""A watch's json:PATH record id walks objects and, like a pipeline's --map path, lists by index; an id is
normalised to what the row-id column can hold, or None."""
import json

import pytest
from django.db import connection

from consumers.engine.record_ids import json_field, normaliser, parse_spec


@pytest.mark.parametrize("path, expected", [
    ("json:order.id", "42"), ("json:items.0.sku", "S7"), ("json:items.1.sku", "S8"), ("json:items.2.sku", None),
    ("json:items.x", None), ("json:order.id.0", None), ("json:items", None), ("json:flags.1", "true"),
])
def test_a_json_path_walks_objects_and_list_indexes(path, expected):
    value = json.dumps({"order": {"id": 42}, "items": [{"sku": "S7"}, {"sku": "S8"}], "flags": [False, True]})
    assert json_field(value.encode(), parse_spec(path).path) == expected


@pytest.mark.parametrize("text, expected", [
    ("42", "42"), ("1e3", "1E+3"), ("1.5e-16382", "1.5E-16382"), ("123456e131066", "1.23456E+131071"),
    ("0e200000", "0E+200000"), ("NaN", None), ("x", None),
    # beyond what PostgreSQL's numeric holds: its input refuses them, so the COPY of the audit would fail
    ("1e131072", None), ("-1e200000", None), ("1e-16384", None), ("1.50e-16382", None), ("0e-20000", None),
])
def test_a_numeric_id_is_one_postgresql_numeric_can_hold(text, expected):
    assert normaliser("numeric")(text) == expected


@pytest.mark.django_db
def test_every_numeric_id_the_normaliser_keeps_is_accepted_by_postgresql():
    kept = [normaliser("numeric")(text) for text in ("1e131071", "-9.9e131071", "1e-16383", "0e200000", "1.5e-16382")]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(v::numeric) FROM unnest(%s::text[]) v", [kept])
        assert cursor.fetchone()[0] == len(kept)


@pytest.mark.parametrize("id_type, text, expected", [
    ("smallint", "32767", "32767"), ("smallint", "32768", None), ("smallint", "-32768", "-32768"),
    ("integer", "2147483647", "2147483647"), ("integer", "99999999999", None), ("integer", "-2147483649", None),
    ("bigint", "99999999999", "99999999999"), ("bigint", "9223372036854775808", None),
])
def test_an_integer_id_is_one_its_own_column_can_hold(id_type, text, expected):
    """99999999999 names no row of an integer column: unreadable, as on Spark (its cast gives null), not lost, and
    never compared with the column, which PostgreSQL refuses ("integer out of range")."""
    assert normaliser(id_type)(text) == expected


@pytest.mark.parametrize("value", [
    b'{"id": "\\ud800"}',                          # a lone surrogate, escaped
    b'{"id": "\xed\xa0\x80"}',                      # and as its bytes (json.loads reads them with surrogatepass)
    b'{"id": ' + b"[" * 3000 + b"]" * 3000 + b"}",  # nested deeper than Python's recursion limit
], ids=["escaped-surrogate", "surrogate-bytes", "nested-3000-deep"])
def test_a_json_id_no_text_column_can_hold_or_that_cannot_be_parsed_is_unreadable(value):
    """Each stopped a watch's check for good: the lone surrogate failed the audit's COPY ("could not be audited"),
    the nesting raised RecursionError ("Kafka: reading ..."), and every later check read the same range again."""
    assert json_field(value, parse_spec("json:id").path) is None
