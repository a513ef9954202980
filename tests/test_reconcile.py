"""Reconciliation against the real PostgreSQL, with data written by the commit protocol itself (and a
few hand-made anomalies). Kafka is a stand-in here (watermarks, committed offsets, timestamps), so each
test states the broker facts it needs; tests/test_reconcile_kafka.py runs against the real broker."""
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.kafka.admin import Watermarks
from consumers.models import ActionLog, BatchLedger, DeliveryMode, PartitionHealth, PartitionOffset, Pipeline
from consumers.operations import retention
from consumers.reconciliation import reconcile
from tests.conftest import drop_sink_tables


class FakeKafka:
    """The three Kafka facts reconciliation reads, set by the test."""

    def __init__(self, high=None, log_start=None, committed=None, timestamps=None):
        self.high, self.log_start = high or {}, log_start or {}
        self.committed, self.timestamps = committed or {}, timestamps or {}

    def watermarks(self, topic):
        return {p: Watermarks(self.log_start.get(p, 0), h) for p, h in self.high.items()}

    def committed_offsets(self, group_id, topic):
        return dict(self.committed)

    def record_timestamps(self, topic, offsets):
        return {p: self.timestamps.get(p) for p in offsets}


def records(partition, offsets, value=None):
    return [SourceRecord(partition, o, None, (value or str(o + 1)).encode()) for o in offsets]


@pytest.fixture
def setup(transactional_db):
    """make(mode, transform) -> (pipeline, write) where write(partition, offsets[, value]) commits one batch."""
    conn = db.connect()
    made = []

    def make(mode=DeliveryMode.EXACTLY_ONCE, transform="int_value", name=None):
        pipeline = Pipeline.objects.create(name=name or f"r-{mode}-{len(made)}", topic="nums",
                                           sink_table=f"recon_sink_{len(made)}", delivery_mode=mode,
                                           transform=transform, epoch=1)
        made.append(pipeline)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, pipeline.sink_table, resolve(transform), pipeline.is_exactly_once)
        target = commit.Target.for_pipeline(pipeline)

        def write(partition, offsets, value=None):
            if pipeline.is_exactly_once:
                commit.ensure_positions(conn, pipeline.pk, {partition: offsets[0]})
            return commit.commit_batch(conn, target, 1, {partition: records(partition, offsets, value)})

        return pipeline, write

    yield make
    conn.close()
    drop_sink_tables(pipeline.sink_table for pipeline in made)


def run_sql(statement, params=()):
    with connection.cursor() as cur:
        cur.execute(statement, params)  # test-only statements on fixed table names


def kinds(report, kind):
    return [(f.start, f.end, f.count) for p in report.partitions for f in p.findings if f.kind == kind]


def test_exactly_once_batches_are_proven_exact_with_the_cheap_check(setup):
    pipeline, write = setup()
    write(0, range(0, 50))
    write(0, range(50, 120))
    write(1, range(0, 30))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 120, 1: 30}, committed={0: 120, 1: 30}))
    assert report.exact and report.status == "OK"
    assert (report.lost, report.duplicated, report.phantom, report.lag_records) == (0, 0, 0, 0)
    assert [(p.partition, p.proven, p.verified_offset) for p in report.partitions] == [(0, True, 120), (1, True, 30)]
    assert PartitionHealth.objects.get(pipeline=pipeline, partition=0).verified_offset == 120


def test_at_least_once_rewrite_is_counted_as_duplicates_and_a_ledger_overlap(setup):
    pipeline, write = setup(DeliveryMode.AT_LEAST_ONCE)
    write(0, range(0, 10))
    write(0, range(10, 20))
    write(0, range(10, 25))  # crash after the DB commit, before Kafka's: the batch comes again
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 25}, committed={0: 25}))
    assert (report.lost, report.duplicated) == (0, 10)
    assert kinds(report, "overlap") == [(10, 20, 10)]
    assert kinds(report, "duplicated") == [(10, 20, 10)]
    assert not report.exact and report.status == "ERR"


def test_a_rewrite_below_the_verified_mark_moves_the_mark_back(setup):
    pipeline, write = setup(DeliveryMode.AT_LEAST_ONCE)
    write(0, range(0, 20))
    first = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 20}, committed={0: 20}))
    assert first.exact
    write(0, range(15, 30))  # resumed from an older Kafka offset: 15..19 written twice
    second = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 30}, committed={0: 30}))
    assert second.partitions[0].checked_from == 15
    assert second.duplicated == 5 and kinds(second, "duplicated") == [(15, 20, 5)]
    third = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 30}, committed={0: 30}))
    assert third.duplicated == 5 and third.partitions[0].checked_from == 30  # kept, not re-read


def test_at_most_once_skipped_batch_is_lost_and_a_ledger_gap(setup):
    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))
    # Kafka's offset was committed to 20 before the crash; the consumer resumes there.
    write(0, range(20, 30))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 30}, committed={0: 30}))
    assert (report.lost, report.duplicated) == (10, 0)
    assert kinds(report, "lost") == [(10, 20, 10)] and kinds(report, "gap") == [(10, 20, 10)]


def test_a_kafka_offset_beyond_the_database_is_lost_while_the_consumer_has_not_written(setup):
    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 40}, committed={0: 25}))
    assert report.lost == 15 and kinds(report, "gap") == [(10, 25, 15)]
    assert report.partitions[0].lag_records == 15  # 40 - 25: what lies below Kafka's offset is not lag
    assert report.partitions[0].verified_offset == 10  # the trailing loss is re-evaluated, never marked


def test_dead_letters_are_accounted_for_and_exact(setup):
    pipeline, write = setup()
    write(0, range(0, 5))
    write(0, range(5, 8), value="not-a-number")
    write(0, range(8, 12))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 12}, committed={0: 12}))
    assert report.exact and report.dead_lettered == 3
    assert kinds(report, "dead_letter") == [(5, 8, 3)]


def test_a_deleted_sink_row_is_lost_and_an_extra_row_is_a_duplicate(setup):
    pipeline, write = setup(DeliveryMode.AT_LEAST_ONCE)
    write(0, range(0, 30))
    run_sql(f"DELETE FROM {pipeline.sink_table} WHERE source_offset IN (4, 5, 17)")
    run_sql(f"INSERT INTO {pipeline.sink_table} (id, source_topic, source_partition, source_offset) "
            "VALUES (10, 'nums', 0, 9), (10, 'nums', 0, 9), (21, 'nums', 0, 20)")
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 30}, committed={0: 30}))
    assert kinds(report, "lost") == [(4, 6, 2), (17, 18, 1)]
    assert kinds(report, "duplicated") == [(9, 10, 2), (20, 21, 1)]
    assert (report.lost, report.duplicated) == (3, 3)
    assert not kinds(report, "gap")  # the ledger itself tiles the range


def test_rows_beyond_the_committed_position_are_phantoms(setup):
    pipeline, write = setup()
    write(0, range(0, 10))
    run_sql(f"INSERT INTO {pipeline.sink_table} (id, source_topic, source_partition, source_offset) "
            "VALUES (13, 'nums', 0, 12), (14, 'nums', 0, 13)")
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 20}, committed={0: 10}))
    assert report.phantom == 2 and kinds(report, "phantom") == [(12, 14, 2)]
    assert report.lost == 0 and report.status == "ERR"


def test_multi_row_records_count_duplicates_per_record(setup):
    pipeline, write = setup(DeliveryMode.AT_LEAST_ONCE, transform="csv_ints")
    write(0, range(0, 4), value="1,2,3")
    write(0, range(2, 6), value="4,5,6")  # offsets 2 and 3 again: 3 rows each, one extra record each
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 6}, committed={0: 6}))
    assert report.duplicated == 2 and kinds(report, "duplicated") == [(2, 4, 2)]
    assert report.lost == 0


def test_a_verified_range_is_not_read_again_until_a_full_reverification(setup):
    pipeline, write = setup()
    write(0, range(0, 100))
    kafka = FakeKafka(high={0: 100}, committed={0: 100})
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact
    run_sql(f"DELETE FROM {pipeline.sink_table} WHERE source_offset = 42")  # behind the mark
    write(0, range(100, 150))
    kafka.high, kafka.committed = {0: 150}, {0: 150}
    incremental = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert incremental.partitions[0].checked_from == 100 and incremental.partitions[0].verified_offset == 150
    assert incremental.exact  # offset 42 was verified before it was deleted, and is not read again
    full = reconcile.reconcile_pipeline(pipeline, kafka=kafka, full=True)
    assert full.partitions[0].checked_from == 0 and kinds(full, "lost") == [(42, 43, 1)]
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).lost == 1  # the finding is kept


def rewound(pipeline, to, **position):
    """What a rewind to offset `to` stores, as consumers/operations/rewind.py does: the ledger superseded from there,
    the position (with `position`'s other fields) and the verified offset moved back to it."""
    BatchLedger.objects.filter(pipeline=pipeline, end_offset__gt=to).update(superseded_from=to)
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=to, **position)
    PartitionHealth.objects.filter(pipeline=pipeline).update(verified_offset=to)


def test_a_rewind_with_superseded_ledger_rows_is_not_an_incident(setup):
    pipeline, write = setup()
    write(0, range(0, 50))
    kafka = FakeKafka(high={0: 50}, committed={0: 50})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    # The operator rewinds to 20 and rolls back the sink, as consumers/operations/rewind.py does.
    rewound(pipeline, to=20)
    run_sql(f"DELETE FROM {pipeline.sink_table} WHERE source_offset >= 20")
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done",
                             offsets_after={"0": 20})
    write(0, range(20, 50))  # replayed
    report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert report.exact and not kinds(report, "overlap")
    assert report.status == "REWIND"


def test_a_rewind_that_keeps_the_sink_does_not_make_phantoms_of_the_replay_window(setup):
    pipeline, write = setup()
    write(0, range(0, 50))
    kafka = FakeKafka(high={0: 50}, committed={0: 50})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    rewound(pipeline, to=30, replay_until=50)
    during = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert during.exact and during.phantom == 0
    write(0, range(30, 50))
    after = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert after.exact and after.partitions[0].verified_offset == 50


def test_a_position_below_the_log_start_is_unrecoverable(setup):
    pipeline, write = setup()
    write(0, range(0, 10))
    # Retention deleted offsets 0..24 while the pipeline was stopped at 10 (DeleteRecords cannot be
    # reproduced on the embedded broker, so the broker facts come from the stand-in).
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 60}, log_start={0: 25},
                                                                    committed={0: 10}))
    assert report.unrecoverable == 15 and kinds(report, "unrecoverable") == [(10, 25, 15)]
    assert report.lost == 0 and report.status == "ERR"


def test_lag_in_seconds_is_the_age_of_the_record_at_the_position(setup):
    pipeline, write = setup()
    write(0, range(0, 10))
    now = timezone.now()
    stamp = int((now - timedelta(seconds=90)).timestamp() * 1000)
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 25}, committed={0: 10},
                                                                    timestamps={0: stamp}), now=now)
    assert report.lag_records == 15 and report.lag_seconds == pytest.approx(90, abs=0.01)


def test_kafka_unreachable_still_verifies_the_sink_and_reports_an_error(setup):
    class Down(FakeKafka):
        def watermarks(self, topic):
            raise ConnectionError("no broker")

    pipeline, write = setup()
    write(0, range(0, 10))
    report = reconcile.reconcile_pipeline(pipeline, kafka=Down(committed={0: 10}))
    assert report.exact and report.status == "ERR" and "no broker" in report.kafka_error
    assert report.partitions[0].lag_records is None


def test_report_json_has_the_documented_shape(setup):
    pipeline, write = setup()
    write(0, range(0, 10))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 12}, committed={0: 10}))
    data = reconcile.report_json([report])
    entry = data["pipelines"][0]
    assert {"name", "status", "lost", "duplicated", "phantom", "dead_lettered", "lag_records", "lag_seconds",
            "partitions"} <= set(entry)
    assert {"partition", "log_start", "high_watermark", "next_offset", "kafka_committed", "lost", "duplicated",
            "phantom", "findings"} <= set(entry["partitions"][0])
    assert (entry["name"], entry["lag_records"], entry["partitions"][0]["next_offset"]) == (pipeline.name, 2, 10)


def test_the_stored_and_the_served_findings_have_one_shape_and_read_back_as_they_were(setup):
    pipeline, write = setup()
    write(0, range(0, 5))
    write(0, [5], value="bad")
    write(0, range(6, 10))
    run_sql(f"INSERT INTO {pipeline.sink_table} (id, source_topic, source_partition, source_offset) "
            "VALUES (13, 'nums', 0, 12)")
    kafka = FakeKafka(high={0: 20}, committed={0: 10})
    first = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    served = reconcile.report_json([first])["pipelines"][0]["partitions"][0]["findings"]
    assert served == [{"kind": "dead_letter", "start": 5, "end": 6, "count": 1, "scope": "verified"},
                      {"kind": "phantom", "start": 12, "end": 13, "count": 1, "scope": "current"}]
    assert PartitionHealth.objects.get(pipeline=pipeline, partition=0).findings == served
    # Nothing new to verify: the next run keeps the stored verified finding, read back as it was.
    again = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    assert again.partitions[0].findings == first.partitions[0].findings


def test_offsets_a_rewind_forward_skipped_are_planned_not_lost(setup):
    pipeline, write = setup()
    write(0, range(0, 20))
    # The operator skips 20..59 (rewind --to-offset 60): no row, no ledger row there, on purpose.
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=60)
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done",
                             offsets_before={"0": 20}, offsets_after={"0": 60})
    write(0, range(60, 70))
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 70}, committed={0: 70}))
    assert report.exact and report.status == "REWIND"
    assert (report.lost, report.gap, report.partitions[0].skipped) == (0, 0, 40)
    assert [(f.kind, f.start, f.end, f.planned) for f in report.partitions[0].findings] == [
        ("gap", 20, 60, True), ("lost", 20, 60, True)]


def test_a_range_skipped_years_ago_stays_planned_after_the_action_log_retention(setup, settings):
    pipeline, write = setup()
    write(0, range(0, 20))
    PartitionOffset.objects.filter(pipeline=pipeline).update(next_offset=60)
    now = timezone.now()
    long_ago = now - timedelta(days=settings.TALLY_RETAIN_ACTION_LOG_DAYS + 1)
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done", created_at=long_ago,
                             offsets_before={"0": 20}, offsets_after={"0": 60})
    dry = ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done", dry_run=True,
                                   created_at=long_ago, offsets_before={"0": 60}, offsets_after={"0": 0})
    write(0, range(60, 70))
    kafka = FakeKafka(high={0: 70}, committed={0: 70})
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka, now=now).exact

    assert retention.apply(now=now)["action_log"] == 1   # the dry run goes; the rewind that took effect stays
    assert not ActionLog.objects.filter(pk=dry.pk).exists()
    full = reconcile.reconcile_pipeline(pipeline, kafka=kafka, full=True, now=now)
    assert full.exact and full.status == "OK"
    assert (full.lost, full.partitions[0].skipped) == (0, 40)


def test_a_loss_next_to_a_skipped_range_is_still_an_incident(setup):
    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done",
                             offsets_before={"0": 15}, offsets_after={"0": 40})
    write(0, range(40, 50))  # 10..14 lost by the at-most-once consumer, 15..39 skipped by the operator
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 50}, committed={0: 50}))
    assert (report.lost, report.partitions[0].skipped) == (5, 25)
    assert not report.exact and report.status == "ERR"


def test_folding_many_losses_never_mixes_them_with_a_range_a_rewind_skipped(setup):
    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 20))
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="cli", result="done",
                             offsets_before={"0": 20}, offsets_after={"0": 60})   # 20..59 skipped on purpose
    write(0, [60])
    first = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 61}, committed={0: 61}))
    assert first.exact and first.partitions[0].skipped == 40
    for n in range(1, 102):   # then the at-most-once consumer loses every other record: 101 losses, folded
        write(0, [60 + 2 * n])
    report = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 263}, committed={0: 263}))
    part = report.partitions[0]
    assert (part.lost, part.gap, part.skipped) == (101, 101, 40)
    # In one run as well: found in the same range, the skipped offsets are not folded into the losses.
    full = reconcile.reconcile_pipeline(pipeline, kafka=FakeKafka(high={0: 263}, committed={0: 263}), full=True)
    part = full.partitions[0]
    assert (part.lost, part.gap, part.skipped) == (101, 101, 40)
    assert [(f.start, f.end, f.count) for f in part.findings if f.kind == "lost" and f.planned] == [(20, 60, 40)]


def test_only_a_unique_index_on_the_provenance_key_spares_the_distinct_count(setup):
    from consumers.reconciliation.verify import sink_shape

    exactly, _ = setup()
    classic, _ = setup(DeliveryMode.AT_LEAST_ONCE)
    multi, _ = setup(transform="csv_ints")
    run_sql(f"CREATE UNIQUE INDEX recon_other_key ON {classic.sink_table} (id, source_offset)")
    with connection.cursor() as cur:
        shapes = [sink_shape(cur.cursor, p.sink_table, "nums", p.transform == "csv_ints")
                  for p in (exactly, classic, multi)]
    assert [s.unique_key for s in shapes] == [True, False, True]


def test_a_kafka_offset_beyond_the_database_is_in_flight_while_an_at_most_once_consumer_is_alive(setup):
    from consumers.models import ConsumerRun, RunState

    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))
    run = ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=1, state=RunState.RUNNING)
    kafka = FakeKafka(high={0: 40}, committed={0: 20})  # committed to Kafka, being written now
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).exact
    run.state = RunState.CRASHED
    run.save()
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).lost == 10


def test_a_killed_run_whose_row_still_says_running_does_not_excuse_a_loss_once_a_later_run_started(setup):
    from datetime import timedelta

    from django.utils import timezone

    from consumers.models import ConsumerRun, RunState

    pipeline, write = setup(DeliveryMode.AT_MOST_ONCE)
    write(0, range(0, 10))
    kafka = FakeKafka(high={0: 20}, committed={0: 20})
    # SIGKILL leaves the row "running" with a fresh heartbeat; the restart that followed has ended.
    killed_at = timezone.now() - timedelta(seconds=2)
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=1, state=RunState.RUNNING,
                               started_at=killed_at - timedelta(seconds=5), heartbeat_at=killed_at)
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=2, state=RunState.STOPPED,
                               started_at=killed_at + timedelta(seconds=1), ended_at=timezone.now())
    assert reconcile.reconcile_pipeline(pipeline, kafka=kafka).lost == 10


def test_reconciling_while_batches_commit_never_reports_a_phantom_or_a_loss(setup):
    import threading

    pipeline, _ = setup()
    target = commit.Target.for_pipeline(pipeline)
    done = threading.Event()

    def writer():
        conn = db.connect()
        try:
            commit.ensure_positions(conn, pipeline.pk, {0: 0})
            for start in range(0, 3000, 10):
                commit.commit_batch(conn, target, 1, {0: records(0, range(start, start + 10))})
        finally:
            conn.close()
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    kafka = FakeKafka(high={0: 3000}, committed={0: 0})
    reports = []
    while not done.is_set():
        reports.append(reconcile.reconcile_pipeline(pipeline, kafka=kafka))
    thread.join()
    reports.append(reconcile.reconcile_pipeline(pipeline, kafka=kafka))
    assert len(reports) > 3
    assert [r.partitions[0].findings for r in reports if not r.exact] == []
    assert reports[-1].partitions[0].verified_offset == 3000


def test_findings_stay_bounded_across_runs_with_exact_counts(setup):
    from consumers.reconciliation.verify import MAX_FINDINGS_PER_KIND

    pipeline, write = setup()
    kafka = FakeKafka()
    for run in range(3):  # every other record is bad: one dead-letter range per bad record
        base, end = run * 2 * MAX_FINDINGS_PER_KIND, (run + 1) * 2 * MAX_FINDINGS_PER_KIND
        for offset in range(base, end, 2):
            write(0, [offset])
            write(0, [offset + 1], value="bad")
        kafka.high = kafka.committed = {0: end}
        report = reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    letters = [f for f in report.partitions[0].findings if f.kind == "dead_letter"]
    assert len(letters) == MAX_FINDINGS_PER_KIND and report.dead_lettered == 3 * MAX_FINDINGS_PER_KIND
    assert letters[0].folded == 2 * MAX_FINDINGS_PER_KIND + 1 and letters[0].start == 1
    assert (letters[-1].start, letters[-1].end) == (6 * MAX_FINDINGS_PER_KIND - 1, 6 * MAX_FINDINGS_PER_KIND)
    assert report.exact
