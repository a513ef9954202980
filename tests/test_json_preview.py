"""The preview of a `json` pipeline, from the form and the API: the table's columns with a proposed mapping, and
the topic's first 20 records each as its row or its dead letter -- before anything is created. Then the
pipeline is created with that mapping and run: it writes exactly what the preview showed."""
import json

import pytest
from django.db import connection
from django.test import Client
from psycopg2 import sql

from consumers.engine.python import run_pipeline
from consumers.models import DeadLetter, Pipeline
from tests.producing import send
from tests.sink_rows import made_sink_table
from tests.views_helpers import make_operator

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

GIVEN_MAP = "order_id=id\nordered_at=at\nsku=items.0.sku"
ORDER_COLUMNS = ("order_id bigint NOT NULL, customer_name text, amount numeric(10,2) CHECK (amount >= 0), "
                 "ordered_at timestamptz, sku text, created_at timestamptz NOT NULL DEFAULT now()")


def orders():
    """22 records: good ones, one the database refuses (a CHECK), one not JSON, one with a bad id."""
    records = [{"id": 1, "customer": {"name": "Ada"}, "amount": "12.5", "at": "2024-05-01T10:30:00Z",
                "items": [{"sku": "a-1"}], "created_at": 1_714_559_400_000},
               {"id": 2, "customer": {"name": "Bob"}, "amount": -3, "at": 1_714_559_400_000},
               b"not json",
               {"id": "x", "customer": {"name": "Cy"}},
               {"id": 5, "customer": {"name": "Eve"}, "extra": {"ignored": True}}]
    records += [{"id": 100 + n, "customer": {"name": f"c{n}"}, "amount": n + 0.25,
                 "at": f"2024-06-{n + 1:02d}T00:00:00+02:00", "items": [{"sku": f"s{n}"}, {"sku": "second"}]}
                for n in range(17)]
    return records


@pytest.fixture
def topic(make_topic):
    name = make_topic("orders", partitions=1)
    send(name, [(None, str(i).encode(), record if isinstance(record, bytes) else json.dumps(record).encode())
                for i, record in enumerate(orders())])
    return name


@pytest.fixture
def table():
    with made_sink_table("orders", ORDER_COLUMNS) as name:
        yield name


@pytest.fixture
def operator():
    client = Client()
    client.force_login(make_operator())
    return client


def form(topic, table, **overrides):
    return {"name": "orders", "topic": topic, "sink_table": table, "mode": "exactly-once", "transform": "json",
            "group": "", "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "stop",
            "map": GIVEN_MAP, **overrides}


def table_count(table):
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        return cursor.fetchone()[0]


def test_the_form_previews_proposes_a_mapping_and_creates_nothing(operator, topic, table):
    response = operator.post("/pipelines/new/", {**form(topic, table), "preview": "1"})
    page = response.content.decode()
    assert response.status_code == 200, page
    assert 'id="preview-records"' in page and page.count('class="preview-record"') == 20
    # Proposed: customer_name from customer.name (its path spells it). Not created_at: it has a default, and
    # mapping it would dead-letter the records that lack it.
    assert "customer_name=customer.name" in page and "created_at=" not in page
    assert "dead letter: database refused: 23514" in page and "not JSON" in page
    assert "column order_id (from id): not an integer for bigint: &#x27;x&#x27;" in page
    assert not Pipeline.objects.exists() and table_count(table) == 0


def test_the_preview_is_what_the_run_then_writes(operator, topic, table, kafka_client):
    response = operator.post("/api/pipelines/preview", {**form(topic, table), "map": {
        "order_id": "id", "ordered_at": "at", "sku": "items.0.sku"}}, content_type="application/json")
    assert response.status_code == 200, response.content
    preview = response.json()
    assert preview["proposed"] == {"customer_name": "customer.name"}
    assert len(preview["records"]) == 20 and [r["offset"] for r in preview["records"]] == list(range(20))
    assert not Pipeline.objects.exists() and table_count(table) == 0

    created = operator.post("/api/pipelines/", {**form(topic, table), "map": preview["mapping"]},
                            content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["map"] == preview["mapping"]
    result = run_pipeline("orders", stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail

    columns = [c["name"] for c in preview["columns"] if c["source"] is not None]
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT source_offset, {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            sql.Identifier(table)))
        written = {offset: dict(zip(columns, values, strict=True)) for offset, *values in cursor.fetchall()}
    dead = dict(DeadLetter.objects.filter(pipeline__name="orders").values_list("offset", "error"))
    rows_seen = letters_seen = 0
    for record in preview["records"]:
        if record["row"] is not None:
            assert written[record["offset"]] == record["row"]
            rows_seen += 1
        else:
            assert dead[record["offset"]] == record["dead_letter"]
            letters_seen += 1
    assert (rows_seen, letters_seen) == (17, 3)
    assert written[0]["ordered_at"] == "2024-05-01 10:30:00+00" and written[0]["customer_name"] == "Ada"
    assert written[4]["amount"] is None and written[5]["sku"] == "s0"


def test_the_api_refuses_bad_input_naming_the_field(operator, topic, table):
    response = operator.post("/api/pipelines/preview", {**form(topic, table), "map": {"order_id": 5}},
                             content_type="application/json")
    assert response.status_code == 400 and "map" in response.json()["errors"]
    response = operator.post("/api/pipelines/", {**form(topic, table), "map": {"nope": "x"}},
                             content_type="application/json")
    assert response.status_code == 400 and "no column 'nope'" in json.dumps(response.json()["errors"]["map"])
    response = operator.post("/api/pipelines/", {**form(topic, table), "delete_on_tombstone": "yes"},
                             content_type="application/json")
    assert response.status_code == 400 and "delete_on_tombstone" in response.json()["errors"]
    assert not Pipeline.objects.exists()


def test_the_preview_shows_values_as_postgresql_prints_them_not_as_their_text_cast(operator, make_topic, kafka_client):
    """inet::text adds the netmask (10.0.0.1/32) where the table, psql and the API's readers show 10.0.0.1."""
    name = make_topic("hosts", partitions=1)
    send(name, [(None, None, json.dumps(record).encode())
                for record in ({"id": 1, "ip": "10.0.0.1", "net": "10.1.0.0/16"}, {"id": 2, "ip": None},
                               {"id": 3, "ip": "999.1.1.1"})])
    with made_sink_table("hosts", "id bigint NOT NULL, ip inet, net cidr") as table:
        fields = {**form(name, table), "name": "hosts", "map": {}}
        response = operator.post("/api/pipelines/preview", fields, content_type="application/json")
        assert response.status_code == 200, response.content
        records = response.json()["records"]
        rows = [record["row"] for record in records[:2]]
        # PostgreSQL's own parser refuses the third: the dead letter names the column, as the mapping's do.
        refused = 'database refused: 22P02 invalid input syntax for type inet: "999.1.1.1" (column ip)'
        assert records[2]["dead_letter"] == refused
        assert rows == [{"id": "1", "ip": "10.0.0.1", "net": "10.1.0.0/16"}, {"id": "2", "ip": None, "net": None}]
        assert operator.post("/api/pipelines/", fields, content_type="application/json").status_code == 201
        result = run_pipeline("hosts", stop_when_caught_up=True, max_seconds=60)
        assert result.reason == "caught_up", result.detail
        with connection.cursor() as cursor:
            cursor.execute(sql.SQL("SELECT id::text, ip, net FROM {} ORDER BY id").format(sql.Identifier(table)))
            written = [dict(zip(("id", "ip", "net"), row, strict=True)) for row in cursor.fetchall()]
        assert written == rows
        assert DeadLetter.objects.get(pipeline__name="hosts", offset=2).error == refused


def test_a_table_whose_own_id_is_an_identity_is_previewed_as_the_run_writes_it(operator, make_topic, kafka_client):
    # The preview's temporary copy of the table kept the identity's NOT NULL without its sequence: every record was
    # shown as the dead letter 'null value in column "id"', where the run writes them all.
    name = make_topic("accounts", partitions=1)
    send(name, [(None, None, json.dumps({"account": account}).encode()) for account in ("a", "b")])
    columns = "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account text NOT NULL"
    with made_sink_table("accounts", columns) as table:
        fields = {**form(name, table), "name": "accounts", "map": {}}
        response = operator.post("/api/pipelines/preview", fields, content_type="application/json")
        assert response.status_code == 200, response.content
        assert [(r["row"], r["dead_letter"]) for r in response.json()["records"]] == [
            ({"account": "a"}, None), ({"account": "b"}, None)]


def test_the_preview_shows_epoch_seconds_as_their_date_and_notes_seconds_read_as_milliseconds(operator, make_topic,
                                                                                             table, kafka_client):
    name = make_topic("stamps", partitions=1)
    send(name, [(None, None, json.dumps({"id": n, "at": 1_714_559_400 + n}).encode()) for n in range(3)])
    fields = {**form(name, table), "name": "stamps", "map": {"order_id": "id", "ordered_at": "at"}}
    response = operator.post("/api/pipelines/preview", fields, content_type="application/json")
    assert response.status_code == 200, response.content
    preview = response.json()
    # Read as milliseconds (the default), 1714559400 is January 20, 1970: written as it is, with a note.
    assert preview["records"][0]["row"]["ordered_at"] == "1970-01-20 20:15:59.4+00"
    assert preview["notes"] == [
        "column ordered_at (from at): 3 of 3 records hold a number that, read as epoch milliseconds (the default), "
        "is in 1970 (1714559400 is 1970-01-20): if it counts seconds, map it as ordered_at=at::seconds"]
    page = operator.post("/pipelines/new/", {**form(name, table), "name": "stamps", "preview": "1",
                                             "map": "order_id=id\nordered_at=at"}).content.decode()
    assert 'id="preview-notes"' in page and "map it as ordered_at=at::seconds" in page

    fields["map"]["ordered_at"] = "at::seconds"
    preview = operator.post("/api/pipelines/preview", fields, content_type="application/json").json()
    assert [r["row"]["ordered_at"] for r in preview["records"]] == [
        "2024-05-01 10:30:00+00", "2024-05-01 10:30:01+00", "2024-05-01 10:30:02+00"]
    assert preview["notes"] == []
    page = operator.post("/pipelines/new/", {**form(name, table), "name": "stamps", "preview": "1",
                                             "map": "order_id=id\nordered_at=at::seconds"}).content.decode()
    assert 'id="preview-notes"' not in page and "2024-05-01 10:30:00+00" in page
    assert not Pipeline.objects.exists() and table_count(table) == 0


def test_a_record_nested_thousands_deep_is_previewed_as_its_dead_letter_not_a_500(operator, make_topic, table):
    """The preview walks each record's fields to propose a mapping; a record nested 3,000 deep raised RecursionError
    there, a 500 on the API and the form. The run dead-letters such a record, and the preview now shows it so."""
    name = make_topic("deep", partitions=1)
    deep = b'{"id": 1, "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    send(name, [(None, b"0", json.dumps({"id": 7, "customer": {"name": "Ada"}}).encode()), (None, b"1", deep)])

    api = operator.post("/api/pipelines/preview", form(name, table, map={"order_id": "id"}),
                        content_type="application/json")
    page = operator.post("/pipelines/new/", {**form(name, table), "preview": "1"})

    assert api.status_code == 200, api.content[:300]
    assert [r["dead_letter"] is None for r in api.json()["records"]] == [True, False]
    assert page.status_code == 200 and page.content.decode().count('class="preview-record"') == 2
