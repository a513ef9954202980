"""Keyed watches when a key's records lie in two partitions that different checks settle: the record an earlier
check settled in one partition still replaces the older record another check settles later in the other. Checked on
PostgreSQL and on Spark, which must agree (the parity style of tests/test_watch_spark.py)."""
import json
import uuid

import pytest
from django.utils import timezone

from consumers.kafka import admin
from consumers.models import WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit
from tests.test_watch_keyed_edges import T0, produce_at
from tests.test_watch_keyed_json import create_table
from tests.test_watch_spark import spark, spark_matches  # noqa: F401 (fixtures, used by name)
from tests.watch_helpers import stored_findings

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def order(order_id: str) -> bytes:
    return json.dumps({"order": {"id": order_id}}).encode()


def stored(watch) -> tuple[list, list]:
    ranges = sorted((r.partition, r.start, r.end, r.records, r.superseded, r.unreadable, r.lost, r.lost_offsets)
                    for r in WatchRange.objects.filter(watch=watch))
    findings = stored_findings(watch, "kind")
    return ranges, findings


def check_twice_on_both_paths(spark_matches, group: str, topic: str, commits: list[dict], **spec):  # noqa: F811
    """Two watches of one group, topic and table, one matched on PostgreSQL, one on Spark; after each commit of
    `commits`, both are checked. Returns the PostgreSQL watch's last report and what it stored, once both paths
    agreed at every check."""
    watches = [watch_setup.create(watch_setup.WatchSpec(name=f"{engine}-{uuid.uuid4().hex[:6]}", group=group,
                                                        topic=topic, settle_seconds=0, keyed=True, **spec))[0]
               for engine in ("pg", "spark")]
    for commit in commits:
        admin.commit_offsets(group, topic, commit)
        spark_matches.clear()
        pg, on_spark = (watch_audit.check_watch(watch, now=timezone.now(), spark_threshold=threshold)
                        for watch, threshold in zip(watches, (0, 1), strict=True))
        assert not (pg.error or on_spark.error), pg.error or on_spark.error
        assert spark_matches == [watches[1].name]
        assert on_spark.as_json() | {"lag": None} == pg.as_json() | {"lag": None}
        assert stored(watches[1]) == stored(watches[0])
    return pg, *stored(watches[0])


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("record_id, value", [("key", lambda name: name.encode()), ("json:order.id", order)],
                         ids=["key", "json"])
def test_a_key_replaced_in_a_partition_an_earlier_check_settled_is_not_lost(make_topic, table_name, spark_matches,  # noqa: F811
                                                                             record_id, value):
    """K written to partition 0, then deleted by a tombstone in partition 1 (the producer's partitioning
    changed); the consumer applied both, so no row K. Partition 1 is committed and checked first, partition 0 a
    check later: its record of K is superseded by the tombstone the earlier check settled, not lost. M, written
    to partition 0 only (and before K's tombstone), has no row: lost, whatever partition 1 holds."""
    topic, group = make_topic("moved", partitions=2), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"K", value("K"), T0), (0, b"M", value("M"), T0 + 500), (1, b"K", None, T0 + 1000),
                       (1, b"N", value("N"), T0 + 2000)])
    create_table(table_name, ["N"])

    report, ranges, findings = check_twice_on_both_paths(
        spark_matches, group, topic, [{0: 0, 1: 2}, {0: 2, 1: 2}], sink_table=table_name, record_id=record_id,
        row_id="id")

    assert findings == [(0, 1, "lost")], findings   # M's record only
    assert (report.checked, report.lost, report.duplicated) == (4, 1, 0)
    assert [(r[0], r[4]) for r in ranges] == [(0, 1), (1, 0)]   # K's record in partition 0: superseded
