"""The new-pipeline form for a JSON topic, in a real browser: it reads the table's columns, proposes a mapping and
shows the topic's first 20 records as the rows (or dead letters, with their reasons) the run would write, before
anything is created; then the pipeline is created from the form and run, and it writes what the preview showed."""
import json

import pytest
from django.db import connection
from playwright.sync_api import expect
from psycopg2 import sql

from consumers.engine.python import run_pipeline
from consumers.models import DeadLetter, Pipeline
from tests.conftest import screenshot_dir
from tests.producing import send
from tests.sink_rows import made_sink_table
from tests.test_browser_dashboard import browser, log_in, page  # noqa: F401  (fixtures)
from tests.views_helpers import make_operator

pytestmark = [pytest.mark.browser, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

NOT_JSON, BAD_AMOUNT, REFUSED_BY_CHECK = 3, 6, 9  # offsets of the records that become dead letters


def orders() -> list[bytes]:
    """24 records: 20 are previewed. Top-level fields named as columns, a nested customer.name and meta.source that
    the form proposes, one value that is not JSON, one amount that is not a number, one the CHECK refuses."""
    records = [json.dumps({"order_id": n, "customer": {"name": f"c{n}"}, "amount": n + 0.25,
                           "ordered_at": f"2024-06-{n + 1:02d}T10:00:00+02:00", "meta": {"source": "web"}}).encode()
               for n in range(24)]
    records[NOT_JSON] = b"not json"
    records[BAD_AMOUNT] = json.dumps({"order_id": 6, "amount": "lots"}).encode()
    records[REFUSED_BY_CHECK] = json.dumps({"order_id": 9, "amount": -1}).encode()
    return records


@pytest.fixture
def topic(make_topic):
    name = make_topic("browser-json", partitions=1)
    send(name, [(None, None, value) for value in orders()])
    return name


@pytest.fixture
def table():
    with made_sink_table("bj", "order_id bigint NOT NULL, customer_name text, amount numeric(10,2) CHECK "
                         "(amount >= 0), ordered_at timestamptz, source text") as name:
        yield name


def shown_preview(browser_page) -> tuple[list[str], dict[int, list[str] | str]]:
    """(written columns, {offset: the row's cells as shown, or the dead letter's text})."""
    columns = browser_page.locator("#preview-records thead th code").all_inner_texts()
    shown = {}
    for row in browser_page.locator("#preview-records tbody tr.preview-record").all():
        offset = int(row.get_attribute("data-offset"))
        dead = row.locator(".dead-letter")
        cells = row.locator("td").all_inner_texts()[3:]
        shown[offset] = dead.inner_text() if dead.count() else cells
    return columns, shown


def written(table: str, columns: list[str]) -> dict[int, list[str]]:
    """{offset: the row's values as text, NULL shown as the page shows it}."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT source_offset, {} FROM {}").format(
            sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns),
            sql.Identifier(table)).as_string(cursor.cursor))
        return {offset: ["NULL" if v is None else v for v in values] for offset, *values in cursor.fetchall()}


def test_the_form_proposes_a_mapping_previews_20_records_and_the_run_writes_what_it_showed(
        page, live_server, topic, table):  # noqa: F811
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/new/")
    page.get_by_label("Name", exact=True).fill("orders-json")
    page.get_by_label("Topic", exact=True).fill(topic)
    page.get_by_label("Sink table", exact=True).fill(table)
    page.get_by_label("Transform", exact=True).fill("json")
    page.locator("#preview-pipeline").click()

    # The table's columns, each with where it comes from: the nested fields are proposed, and filled in the form.
    expect(page.locator("#json-preview h2")).to_have_text("Preview: nothing is created yet")
    columns_table = page.locator("#preview-columns")
    expect(columns_table).to_contain_text("customer.name")
    expect(columns_table).to_contain_text("meta.source")
    expect(columns_table.locator("tr", has_text="source_offset")).to_contain_text("not written")
    mapping = page.get_by_label("Mapping (transform json)").input_value()
    assert set(mapping.split()) == {"customer_name=customer.name", "source=meta.source"}
    assert not Pipeline.objects.exists()

    # The first 20 records: rows as the table would hold them, dead letters with their reasons.
    expect(page.locator("#preview-records tbody tr.preview-record")).to_have_count(20)
    columns, shown = shown_preview(page)
    assert columns == ["order_id", "customer_name", "amount", "ordered_at", "source"]
    assert sorted(shown) == list(range(20))
    assert "not JSON" in shown[NOT_JSON]
    assert "column amount (from amount): not a number" in shown[BAD_AMOUNT] and "'lots'" in shown[BAD_AMOUNT]
    assert "database refused" in shown[REFUSED_BY_CHECK] and "check constraint" in shown[REFUSED_BY_CHECK]
    assert shown[1] == ["1", "c1", "1.25", "2024-06-02 08:00:00+00", "web"]
    page.screenshot(path=str(screenshot_dir() / "pipeline-new-json-preview.png"), full_page=True)

    # Created from the same form (the proposed mapping now in it), then run: it writes what the preview showed.
    page.locator("#create-pipeline").click()
    expect(page.get_by_role("heading", name="orders-json")).to_be_visible()
    pipeline = Pipeline.objects.get(name="orders-json")
    assert pipeline.json_map == {"customer_name": "customer.name", "source": "meta.source"}
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up" and result.records == 24, result
    rows = written(table, columns)
    letters = dict(DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", "error"))
    for offset, preview in shown.items():
        if isinstance(preview, str):
            assert offset not in rows and preview == f"dead letter: {letters[offset]}", offset
        else:
            assert rows[offset] == preview, offset
    assert sorted(letters) == [NOT_JSON, BAD_AMOUNT, REFUSED_BY_CHECK] and len(rows) == 21
