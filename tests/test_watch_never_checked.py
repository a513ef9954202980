"""A watch nobody has checked yet has measured nothing: every door says UNKNOWN (as for a pipeline never
reconciled), not the OK its row starts with. Once a check has run, its status is shown as measured."""
import json

import pytest
from django.utils import timezone

from consumers.models import Status, Watch, WatchPartition
from tests.commands import run_command

pytestmark = pytest.mark.django_db(transaction=True)   # a command closes its connection when it ends


@pytest.fixture
def unchecked():
    watch = Watch.objects.create(name="team", group_id="team-group", topic="team")
    WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=0)
    return watch


def test_a_watch_never_checked_is_unknown_at_every_door(unchecked, viewer_client, capsys):
    listed = viewer_client.get("/api/watches/").json()["watches"][0]
    assert (listed["status"], [p["status"] for p in listed["partitions"]]) == ("UNKNOWN", ["UNKNOWN"])
    detail = viewer_client.get("/api/watches/team/").json()
    assert (detail["status"], [p["status"] for p in detail["partitions"]]) == ("UNKNOWN", ["UNKNOWN"])
    metrics = viewer_client.get("/metrics").content.decode()
    assert 'tally_watch_status{group="team-group",status="UNKNOWN",topic="team",watch="team"} 1.0' in metrics
    assert 'tally_watch_status{group="team-group",status="OK",topic="team",watch="team"} 0.0' in metrics
    page = viewer_client.get("/watches/team/").content.decode()
    assert 'data-status="UNKNOWN"' in page and 'data-status="OK"' not in page
    code, out, _ = run_command(capsys, "watch", "list", "--json")
    assert code == 0 and json.loads(out)[0]["status"] == "UNKNOWN"
    code, out, _ = run_command(capsys, "watch", "show", "team", "--json")
    shown = json.loads(out)
    assert (shown["status"], [p["status"] for p in shown["partitions"]]) == ("UNKNOWN", ["UNKNOWN"])


def test_a_checked_watch_shows_the_status_its_check_measured(unchecked, viewer_client):
    now = timezone.now()
    Watch.objects.filter(pk=unchecked.pk).update(status=Status.OK, checked_at=now)
    WatchPartition.objects.filter(watch=unchecked).update(status=Status.OK, checked_at=now)
    listed = viewer_client.get("/api/watches/").json()["watches"][0]
    assert (listed["status"], [p["status"] for p in listed["partitions"]]) == ("OK", ["OK"])


def test_counts_nothing_measured_are_null_not_zero(unchecked, viewer_client):
    # "0 lost" would claim a check nobody ran: before a check, and for a watch that names no table, the
    # counts are null in the API, and /metrics has no sample for them.
    Watch.objects.filter(pk=unchecked.pk).update(sink_table="team_rows")
    counts = ("lost", "duplicated", "phantom")
    assert [viewer_client.get("/api/watches/team/").json()[c] for c in counts] == [None, None, None]
    assert [viewer_client.get("/api/watches/").json()["watches"][0][c] for c in counts] == [None, None, None]
    assert "tally_watch_lost_records{" not in viewer_client.get("/metrics").content.decode()

    now = timezone.now()
    Watch.objects.filter(pk=unchecked.pk).update(status=Status.OK, checked_at=now)
    WatchPartition.objects.filter(watch=unchecked).update(status=Status.OK, checked_at=now, lost=2)
    assert [viewer_client.get("/api/watches/team/").json()[c] for c in counts] == [2, 0, 0]
    assert ('tally_watch_lost_records{group="team-group",topic="team",watch="team"} 2.0'
            in viewer_client.get("/metrics").content.decode())

    Watch.objects.filter(pk=unchecked.pk).update(sink_table="")   # lag only: delivery is not audited
    assert [viewer_client.get("/api/watches/team/").json()[c] for c in counts] == [None, None, None]


def test_a_pipeline_never_reconciled_has_null_counts(viewer_client):
    from tests.conftest import drop_sink_tables
    from tests.pipelines import create_pipeline

    create_pipeline("never-reconciled", "never-reconciled", "never_reconciled_rows")
    try:
        row = viewer_client.get("/api/pipelines/").json()["pipelines"][0]
        assert [row[c] for c in ("status", "lost", "duplicated", "phantom", "dead_lettered")] == [
            "UNKNOWN", None, None, None, None]
        assert "tally_pipeline_lost_records{" not in viewer_client.get("/metrics").content.decode()
    finally:
        drop_sink_tables(["never_reconciled_rows"])
