"""A watch's findings read back no further than they are shown (consumers/reconciliation/watch_listing.py): the
first OFFSETS_LISTED offsets of the page, the API and each check's report, and the first MAX_RANGES_PER_PARTITION
ranges of an alert, whatever the watch's history; the counts stay whole."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from alerts.models import AlertRule, RuleKind
from alerts.rules import MAX_RANGES_PER_PARTITION, WatchView, check
from consumers.models import OFFSETS_LISTED, Watch, WatchPartition, WatchRange
from consumers.reconciliation import watch_listing

pytestmark = pytest.mark.django_db
NOW = timezone.now()


def long_history(ranges_per_partition: int, *, lost_every: int = 1, duplicated_every: int = 0) -> Watch:
    """A watch of two partitions whose consumer lost (and duplicated) a record in range after range, as checks
    every 30 s for months store them; its totals count them all."""
    watch = Watch.objects.create(name="long", group_id="g", topic="t", sink_table="s", record_id="value",
                                 row_id="id", checked_at=NOW)
    for partition in (0, 1):
        rows = [WatchRange(watch=watch, partition=partition, start=10 * i, end=10 * i + 10, records=10,
                           lost=int(i % lost_every == 0), lost_offsets=[10 * i + 1] if i % lost_every == 0 else [],
                           duplicated=int(bool(duplicated_every) and i % duplicated_every == 0),
                           duplicated_offsets=[[10 * i + 2, 1]] if duplicated_every and i % duplicated_every == 0
                           else [], checked_at=NOW) for i in range(ranges_per_partition)]
        WatchRange.objects.bulk_create(rows)
        WatchPartition.objects.create(watch=watch, partition=partition, start_offset=0,
                                      settled_offset=10 * ranges_per_partition, committed=10 * ranges_per_partition,
                                      high_watermark=10 * ranges_per_partition, checked=10 * ranges_per_partition,
                                      lost=sum(r.lost for r in rows), duplicated=sum(r.duplicated for r in rows))
    return watch


def every_listed(watch: Watch, limit: int) -> tuple[list, list]:
    """What reading every range with a finding lists (as the listing did before it was bounded)."""
    lost, duplicated = [], []
    for r in WatchRange.objects.filter(watch=watch).exclude(lost=0, duplicated=0).order_by("partition", "start"):
        lost += [{"partition": r.partition, "offset": o} for o in r.lost_offsets[: limit - len(lost)]]
        duplicated += [{"partition": r.partition, "offset": o}
                       for o, _ in r.duplicated_offsets[: limit - len(duplicated)]]
    return lost, duplicated


def test_the_listed_offsets_are_the_first_ones_and_reading_stops_there():
    watch = long_history(1500, duplicated_every=700)   # 3,000 ranges with a loss; 3 duplicates in partition 0 ...

    with CaptureQueriesContext(connection) as captured:
        lost, duplicated = watch_listing.listed_offsets(watch)

    assert (lost, duplicated) == every_listed(watch, OFFSETS_LISTED)
    assert len(lost) == OFFSETS_LISTED and lost[-1] == {"partition": 0, "offset": 10 * (OFFSETS_LISTED - 1) + 1}
    assert duplicated == [{"partition": p, "offset": o} for p in (0, 1) for o in (2, 7002, 14002)]
    reads = [q["sql"] for q in captured.captured_queries if "consumers_watchrange" in q["sql"]]
    # the lost ones: 1,000 ranges, LISTING_CHUNK at a time; the duplicated: one read to the end
    assert len(reads) == OFFSETS_LISTED // watch_listing.LISTING_CHUNK + 1
    assert all("LIMIT" in q for q in reads)


def test_a_kind_no_partition_counts_is_not_read_and_a_short_history_lists_it_all():
    watch = long_history(30, lost_every=3)
    with CaptureQueriesContext(connection) as captured:
        lost, duplicated = watch_listing.listed_offsets(watch, limit=5)
    assert (lost, duplicated) == every_listed(watch, 5) and duplicated == []
    assert [o["offset"] for o in lost] == [1, 31, 61, 91, 121]
    assert sum("consumers_watchrange" in q["sql"] for q in captured.captured_queries) == 1
    assert watch_listing.listed_offsets(watch, limit=100) == every_listed(watch, 100)


def test_an_alert_names_the_first_ranges_and_folds_the_rest_counting_every_record():
    watch = long_history(500)

    with CaptureQueriesContext(connection) as captured:
        view = WatchView.load_all([watch], NOW)[watch.pk]
    finding = check(AlertRule(name="lost", kind=RuleKind.LOST), view)

    assert len(captured.captured_queries) == 2
    # read: the first ranges, and one range folding what the totals count beyond them
    assert [len(p.findings) for p in view.partitions] == [MAX_RANGES_PER_PARTITION + 1] * 2
    assert view.partitions[0].findings[-1] == {"kind": "lost", "start": 10 * MAX_RANGES_PER_PARTITION, "end": 5000,
                                               "count": 500 - MAX_RANGES_PER_PARTITION, "folded": True}
    assert finding.facts["count"] == 1000
    for partition in ("0", "1"):
        part = finding.facts["partitions"][partition]
        assert part["count"] == 500
        assert part["ranges"] == [[10 * i + 1, 10 * i + 2] for i in range(MAX_RANGES_PER_PARTITION)]
        assert part["ranges_truncated"]
    assert "partition 0: offsets 1, 11, 21" in finding.summary
    assert check(AlertRule(name="lost", kind=RuleKind.LOST), WatchView.load(watch, NOW)).facts == finding.facts


def test_an_alert_on_a_history_the_first_ranges_hold_whole_folds_nothing():
    watch = long_history(MAX_RANGES_PER_PARTITION - 1)
    finding = check(AlertRule(name="lost", kind=RuleKind.LOST), WatchView.load(watch, NOW))
    part = finding.facts["partitions"]["0"]
    assert part["count"] == MAX_RANGES_PER_PARTITION - 1 and not part["ranges_truncated"]
    assert part["ranges"] == [[10 * i + 1, 10 * i + 2] for i in range(MAX_RANGES_PER_PARTITION - 1)]
