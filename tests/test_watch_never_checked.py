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
