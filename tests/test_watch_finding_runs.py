"""A watch's findings are stored as runs of consecutive offsets (WatchFinding.run_length): the CSV export still
lists every offset, and a group reset behind the audit cuts a run at the offset it re-audits from. The audit's
own grouping into runs is tested against a real broker (tests/test_watch_trace.py, tests/test_watch_reset.py)."""
import csv
import io
from datetime import UTC, datetime

import pytest

from consumers.models import Watch, WatchFinding, WatchPartition
from consumers.reconciliation import watch_commits, watch_trace
from tests.watch_helpers import stored_findings

pytestmark = pytest.mark.django_db
CHECKED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def watch():
    watch = Watch.objects.create(name="runs", group_id="g", topic="t", sink_table="s", record_id="value",
                                 row_id="id")
    WatchFinding.objects.bulk_create([
        WatchFinding(watch=watch, partition=0, offset=0, run_length=3, kind=WatchFinding.LOST, checked_at=CHECKED),
        WatchFinding(watch=watch, partition=0, offset=20, run_length=20, kind=WatchFinding.LOST, checked_at=CHECKED),
        WatchFinding(watch=watch, partition=0, offset=40, run_length=5, kind=WatchFinding.DUPLICATED, extra=2,
                     checked_at=CHECKED),
        WatchFinding(watch=watch, partition=1, offset=20, run_length=20, kind=WatchFinding.LOST, checked_at=CHECKED),
    ])
    return watch


def test_the_csv_export_lists_every_offset_of_every_run_in_order(watch):
    rows = list(csv.reader(io.StringIO("".join(watch_trace.findings_csv(watch)))))
    expected = ([["0", str(o), "lost", "0"] for o in [0, 1, 2, *range(20, 40)]] +
                [["0", str(o), "duplicated", "2"] for o in range(40, 45)] +
                [["1", str(o), "lost", "0"] for o in range(20, 40)])
    assert rows[0] == list(watch_trace.CSV_COLUMNS)
    assert [row[:4] for row in rows[1:]] == expected
    assert {row[4] for row in rows[1:]} == {CHECKED.isoformat()}


def test_a_reset_cuts_the_run_it_falls_in_and_drops_the_runs_after_it_on_that_partition_only(watch):
    # The group went back to offset 25, behind the settled 60, with no stored range holding it.
    wp = WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=60, committed=25)
    watch_commits.reopen(watch, wp, now=CHECKED)
    assert wp.settled_offset == 25
    assert stored_findings(watch, "kind") == (
        [(0, o, "lost") for o in [0, 1, 2, 20, 21, 22, 23, 24]] + [(1, o, "lost") for o in range(20, 40)])
    assert sorted(WatchFinding.objects.filter(partition=0).values_list("offset", "run_length")) == [(0, 3), (20, 5)]
