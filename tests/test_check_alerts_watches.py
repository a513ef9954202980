"""`check_alerts` on an installation that watches consumers it does not run: its summary counts pipelines and
watches apart, and a watch's alert is named as a watch's."""
import json
from io import StringIO

from django.core.management import call_command

from consumers.models import Watch, WatchPartition, WatchRange
from tests.alert_clock import NOW, default_rules, frozen_clock  # noqa: F401 - autouse fixtures


def watch_that_lost_records() -> Watch:
    watch = Watch.objects.create(name="orders-service", group_id="orders-service", topic="orders", checked_at=NOW,
                                 lag_records=0)
    WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=10, committed=10,
                                  high_watermark=10)
    WatchRange.objects.create(watch=watch, partition=0, start=0, end=10, records=10, lost=2, lost_offsets=[3, 4])
    return watch


def test_the_summary_counts_watches_as_watches_not_as_pipelines():
    watch_that_lost_records()
    out = StringIO()
    call_command("check_alerts", "--no-send", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("FIRING  watch orders-service: 2 lost records"), lines
    assert lines[-1].startswith("0 pipelines, 1 watch, "), lines


def test_the_json_report_counts_watches_apart_and_says_what_fired_on_one():
    watch_that_lost_records()
    out = StringIO()
    call_command("check_alerts", "--json", "--no-send", stdout=out)
    report = json.loads(out.getvalue())
    assert (report["pipelines"], report["watches"]) == (0, 1)
    assert [(a["kind"], a["pipeline"]) for a in report["firing"]] == [("watch", "orders-service")]
