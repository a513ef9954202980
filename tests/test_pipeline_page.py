"""The pipeline page tells the truth about the pipeline's state: its header, status and buttons refresh on
a poll and right after an action; buttons the state does not allow are disabled and say why; the action
log reads as offsets per partition, and names a deleted pipeline."""
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from consumers.models import ActionLog, ActionResult, DesiredState, Pipeline
from tests.views_helpers import make_pipeline

pytestmark = pytest.mark.django_db


def buttons(html):
    """{verb: reason or ""} of the action buttons in the page."""
    found = {}
    for verb, attributes in re.findall(r'<button type="submit" id="action-(\w+)"([^>]*)>', html):
        reason = re.search(r'title="([^"]*)"', attributes)
        found[verb] = reason.group(1) if "disabled" in attributes else ""
    return found


def test_a_stopped_pipeline_offers_only_start_and_says_why_the_others_are_disabled(operator_client):
    make_pipeline()
    html = operator_client.get("/pipelines/orders/").content.decode()
    state = buttons(html)
    assert state["start"] == ""
    assert state["pause"] == "Cannot pause: it is not running (stopped)."
    assert state["stop"] == "Cannot stop: it is already stopped (stopped)."
    assert state["resume"].startswith("Cannot resume") and state["restart"].startswith("Cannot restart")


def test_an_action_asks_the_header_to_refresh_and_the_header_fragment_shows_the_new_state(operator_client):
    make_pipeline()
    response = operator_client.post("/pipelines/orders/actions/start/", HTTP_HX_REQUEST="true")
    assert response["HX-Trigger"] == "tally:changed"
    head = operator_client.get("/pipelines/orders/?fragment=head", HTTP_HX_REQUEST="true").content.decode()
    assert head.lstrip().startswith('<div id="pipeline-head"')
    assert 'hx-trigger="every 3s, tally:changed from:body"' in head
    assert '<b id="desired-state">running</b>' in head and '<b id="epoch">1</b>' in head
    state = buttons(head)
    assert state["start"].startswith("Cannot start: it is already running")
    assert state["pause"] == state["stop"] == state["restart"] == ""


def test_the_last_error_is_shown_in_the_header(operator_client):
    pipeline = make_pipeline()
    Pipeline.objects.filter(pk=pipeline.pk).update(last_error="sink: sink table 'sink_orders' does not exist")
    head = operator_client.get("/pipelines/orders/?fragment=head", HTTP_HX_REQUEST="true").content.decode()
    assert "sink table &#x27;sink_orders&#x27; does not exist" in head


def test_the_action_log_shows_offsets_per_partition_not_python_dicts(operator_client):
    pipeline = make_pipeline()
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="alice", result=ActionResult.DONE,
                             offsets_before={"0": 1200, "1": 10}, offsets_after={"0": 1000, "1": 10})
    ActionLog.objects.create(pipeline=None, action="delete", actor="bob", result=ActionResult.DONE,
                             params={"pipeline": "gone"})
    html = operator_client.get("/action-log/").content.decode()
    assert "p0 1,200 → 1,000 · p1 10" in html
    assert "{&#x27;0&#x27;" not in html and "{'0'" not in html
    assert "gone <span class=\"muted\">(deleted)</span>" in html
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED


def test_the_action_log_calls_deleted_only_a_pipeline_that_was_deleted(operator_client):
    """A refused create keeps the name it was asked for: a live pipeline's, or one no pipeline ever had."""
    make_pipeline()
    for name in ("orders", "never-made"):
        ActionLog.objects.create(pipeline=None, action="create", actor="alice", result=ActionResult.REFUSED,
                                 params={"pipeline": name}, message="bad input: name: exists already")
    ActionLog.objects.create(pipeline=None, action="delete", actor="bob", result=ActionResult.DONE,
                             params={"pipeline": "gone"})
    html = operator_client.get("/action-log/").content.decode()
    assert "gone <span class=\"muted\">(deleted)</span>" in html
    assert "orders <span class=\"muted\">(deleted)" not in html and '<a href="/pipelines/orders/">orders</a>' in html
    assert "never-made <span class=\"muted\">(deleted)" not in html and "never-made" in html


def test_charts_cover_the_chosen_range_and_its_bounds(operator_client):
    from datetime import timedelta

    from django.utils import timezone

    from consumers.models import LagSnapshot
    from dashboard import status

    pipeline = make_pipeline()                      # ten samples, 1 to 10 minutes old
    now = timezone.now()
    LagSnapshot.objects.create(pipeline=pipeline, taken_at=now - timedelta(hours=2), lag_records=7)
    quarter = status.chart_series(pipeline, now=now, range_name="15m")
    assert len(quarter["t"]) == 10 and quarter["to"] - quarter["from"] == 900 and quarter["range"] == "15m"
    assert len(status.chart_series(pipeline, now=now, range_name="24h")["t"]) == 11
    with pytest.raises(ValueError, match="Unknown range '1y'"):
        status.chart_series(pipeline, now=now, range_name="1y")
    html = operator_client.get("/pipelines/orders/?range=24h").content.decode()
    assert '<a href="?range=24h#charts" aria-current="true">24 h</a>' in html


def test_the_timeline_shows_a_first_gap_between_the_log_start_and_the_first_batch(operator_client):
    from consumers.models import BatchLedger, PartitionHealth

    pipeline = make_pipeline(partitions=1, with_history=False)
    PartitionHealth.objects.filter(pipeline=pipeline).update(log_start=0)
    BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=10, end_offset=100, records=90,
                               rows_written=90, epoch=1)
    html = operator_client.get("/pipelines/orders/").content.decode()
    timeline = re.search(r'<figure class="timeline" id="timeline-0">.*?</figure>', html, re.S).group(0)
    assert "gaps: 0–9" in timeline and 'class="gap"' in timeline


def test_a_pipeline_whose_run_waits_in_the_queue_says_it_waits_for_a_worker(operator_client, settings):
    settings.TALLY_WORKER_WAIT_SECONDS = 30
    pipeline = make_pipeline()
    now = timezone.now()
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING, runs_waiting=1,
                                                   waiting_since=now - timedelta(seconds=5))
    assert 'id="waiting-for-worker"' not in operator_client.get("/pipelines/orders/").content.decode()
    Pipeline.objects.filter(pk=pipeline.pk).update(waiting_since=now - timedelta(seconds=31))
    html = operator_client.get("/pipelines/orders/").content.decode()
    assert 'id="waiting-for-worker"' in html and "Waiting for a worker: 1 run task queued" in html


def test_an_unknown_chart_range_is_a_400_that_says_which_ranges_exist(operator_client):
    make_pipeline()
    page = operator_client.get("/pipelines/orders/", {"range": "bogus"})
    html = page.content.decode()
    assert page.status_code == 400
    assert "Unknown range &#x27;bogus&#x27;: choose one of 15m, 1h, 24h." in html
    assert 'id="chart-data"' not in html and 'href="?range=1h#charts"' in html  # the valid ranges, one click away
    for empty in ({}, {"range": ""}):  # no range: the default one
        default = operator_client.get("/pipelines/orders/", empty)
        assert default.status_code == 200 and '<a href="?range=1h#charts" aria-current="true">' in (
            default.content.decode())


def test_a_page_of_the_action_log_that_is_not_a_page_is_a_400(operator_client):
    pipeline = make_pipeline()
    for n in range(3):
        ActionLog.objects.create(pipeline=pipeline, action="start", actor=f"a{n}", result=ActionResult.DONE)
    for number, message in [("abc", "Page &#x27;abc&#x27; is not a page number: pages are numbered 1 to 1."),
                            ("99999", "There is no page 99999: pages are numbered 1 to 1."),
                            ("0", "There is no page 0: pages are numbered 1 to 1.")]:
        for fragment in ({}, {"HTTP_HX_REQUEST": "true"}):
            page = operator_client.get("/action-log/", {"page": number}, **fragment)
            html = page.content.decode()
            assert page.status_code == 400 and message in html and '<tr id="action-' not in html
    for first in ({}, {"page": ""}, {"page": "1"}):
        page = operator_client.get("/action-log/", first)
        assert page.status_code == 200 and page.content.decode().count('<tr id="action-') == 3


@pytest.fixture
def events_table():
    from tests.sink_rows import made_sink_table

    with made_sink_table("sink_events", "id bigint NOT NULL, created_at timestamptz, note text DEFAULT 'none'") as name:
        yield name


def test_a_json_pipelines_page_shows_each_column_and_where_it_comes_from(viewer_client, events_table):
    # The page showed neither the transform nor the mapping: a JSON pipeline's `--map` was visible in the API only.
    pipeline = make_pipeline("events-json", partitions=1, topic="events")
    Pipeline.objects.filter(pk=pipeline.pk).update(transform="json", sink_table=events_table,
                                                   json_map={"created_at": "ts::seconds"})

    html = viewer_client.get("/pipelines/events-json/").content.decode()

    mapping = re.search(r'<table class="striped" id="json-mapping">.*?</table>', html, re.S).group(0)
    rows = [re.sub(r"<[^>]+>", " ", row).split() for row in re.findall(r"<tr>(.*?)</tr>", mapping, re.S)[1:]]
    assert rows == [["id", "bigint", "id", "(the", "field", "of", "its", "name)"],
                    ["created_at", "timestamp", "with", "time", "zone", "ts::seconds", "(--map)"],
                    ["note", "text", "not", "written:", "its", "default"]]
    assert '<b id="transform">json</b>' in html


def test_a_json_pipeline_whose_table_is_gone_still_shows_its_map_and_why_it_cannot_be_compiled(viewer_client):
    pipeline = make_pipeline("events-json", partitions=1, topic="events")
    Pipeline.objects.filter(pk=pipeline.pk).update(transform="json", json_map={"created_at": "ts::seconds"})

    html = viewer_client.get("/pipelines/events-json/").content.decode()

    assert "created_at" in html and "ts::seconds" in html
    assert "sink table &#x27;sink_events_json&#x27; does not exist" in html


def test_the_action_log_counts_its_entries_only_as_far_as_it_shows_pages(operator_client, monkeypatch):
    """Counting every entry for "Page 1 of M" read the whole log on each page (36 ms with 200,000 entries, growing
    with it). The page counts no further than a few pages past the one asked for: a shorter log is numbered as
    before; a longer one says there are more pages, and the last pages are still counted exactly."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.views import pages

    monkeypatch.setattr(pages, "ACTION_LOG_PAGE_SIZE", 2)
    monkeypatch.setattr(pages, "ACTION_LOG_COUNTED_PAGES", 2)
    pipeline = make_pipeline()
    for n in range(7):  # pages of 2: four pages, the last holding one entry
        ActionLog.objects.create(pipeline=pipeline, action="start", actor=f"a{n}", result=ActionResult.DONE)

    def shown(number):
        with CaptureQueriesContext(connection) as queries:
            page = operator_client.get("/action-log/", {"page": number})
        counts = [q["sql"] for q in queries.captured_queries
                  if "COUNT(" in q["sql"] and '"consumers_actionlog"' in q["sql"]]
        assert len(counts) == 1 and "LIMIT" in counts[0], counts
        html = page.content.decode()
        return page.status_code, re.search(r"Page \d+ of [^<]*?(?=\s*<|\s*$)", html).group(0).strip() if (
            page.status_code == 200) else html

    assert shown(1)[1] == "Page 1 of more than 2"
    assert shown(3)[1] == "Page 3 of more than 3"
    assert shown(4)[1] == "Page 4 of 4"
    status_code, html = shown(5)
    assert status_code == 400 and "There is no page 5: pages are numbered 1 to 4." in html
    status_code, html = shown("abc")
    assert status_code == 400 and ("Page &#x27;abc&#x27; is not a page number: pages are numbered 1 to more than 2."
                                   in html)
    assert "older →" in operator_client.get("/action-log/", {"page": 3}).content.decode()
