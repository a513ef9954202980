"""Ledger compaction (consumers/reconciliation/compaction.py) under every kind of history: dead letters, holes,
epochs, gaps, overlaps, notes and rewinds (with sink rollback). Reconciliation, trace and the timeline give the
same answers before and after it, and a compaction SIGKILLed inside a step leaves the ledger as it was.

Real PostgreSQL, batches written by the commit protocol (as tests/test_reconcile.py does); Kafka is a stand-in
that knows which offsets hold records."""
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

from consumers.engine import commit, sinks
from consumers.kafka.admin import KafkaAdminError, Watermarks
from consumers.models import BatchLedger, DeliveryMode, LedgerSummary, PartitionHealth, Pipeline
from consumers.operations import rewind
from consumers.operations.offset_specs import PartitionMove
from consumers.reconciliation import compaction, reconcile, trace
from dashboard.timeline import ledger_timelines
from tests.conftest import ROOT
from tests.test_reconcile import FakeKafka, records, setup  # noqa: F401 - `setup` is a fixture used here

LATER = timedelta(days=8)   # past TALLY_LEDGER_KEEP_DAYS (7): every row is old enough


class TraceKafka(FakeKafka):
    """Also what trace reads: partitions, watermarks of some partitions, the record at an offset."""

    KafkaAdminError = KafkaAdminError

    def __init__(self, held: dict[int, set[int]], **kwargs):
        super().__init__(**kwargs)
        self.held = held

    def watermarks(self, topic, partitions=None, cluster=None):
        return {p: Watermarks(self.log_start.get(p, 0), h) for p, h in self.high.items()
                if partitions is None or p in partitions}

    def partitions_for(self, topic, cluster=None):
        return sorted(self.high)

    def read_record(self, topic, partition, offset, cluster=None):
        if offset not in self.held.get(partition, ()):
            return None
        return SimpleNamespace(key=None, value=str(offset + 1).encode(), timestamp_ms=0)

    def records_held(self, topic, partition, ranges, cluster=None):
        return [[o for o in range(s, e) if o in self.held.get(partition, ())] for s, e in ranges]


def write(conn, pipeline, partition, offsets, *, start=None, end=None, epoch=1, value=None):
    """One batch fetched from `start` (default: its first offset) with the position `end` after it."""
    target = commit.Target.for_pipeline(pipeline)
    batch = records(partition, offsets, value) if offsets else []
    start = offsets[0] if start is None else start
    end = offsets[-1] + 1 if end is None else end
    if pipeline.is_exactly_once:
        commit.ensure_positions(conn, pipeline.pk, {partition: start})
    return commit.commit_batch(conn, target, epoch, {partition: batch} if batch else {},
                               fetches={partition: commit.Fetch(start, end)})


def write_batches(conn, pipeline, offsets: range, size, epoch=1):
    """`offsets` of partition 0 written in batches of `size` (the last may be shorter), one commit each."""
    for first in range(offsets.start, offsets.stop, size):
        write(conn, pipeline, 0, list(range(first, min(first + size, offsets.stop))), epoch=epoch)


def answers(pipeline, kafka, offsets):
    """Everything compaction must not change: a full reconciliation, the timeline, and traces."""
    report = reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka)
    found = sorted((p.partition, f.kind, f.start, f.end, f.count, bool(f.planned))
                   for p in report.partitions for f in p.findings)
    timelines = [(t.partition, t.covered, t.gaps, t.overlaps, t.rewinds, t.holes, t.batches)
                 for t in ledger_timelines(pipeline)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trace, "kafka_admin", kafka)
        traced = {o: trace.trace(pipeline, p, o) for p, o in offsets}
    verdicts = {o: (t.verdict, [(b["first_offset"] <= o < b["end_offset"], b["superseded"]) for b in t.batches])
                for o, t in traced.items()}
    return (report.lost, report.duplicated, report.gap, report.overlap, report.dead_lettered, found), timelines, \
        verdicts, traced


def ledger_rows(pipeline, partition=0):
    return list(BatchLedger.objects.filter(pipeline=pipeline, partition=partition).order_by("first_offset", "id")
                .values_list("first_offset", "end_offset", "records", "batches", "epoch"))


def compact():
    # The rows' age is judged by the database's clock, which stamped them (the test clock may be moved).
    return compaction.compact_all(now=compaction.database_now() + LATER)


@pytest.fixture
def made(setup):  # noqa: F811 - tests/test_reconcile.py's fixture: make(mode) -> (pipeline, write)
    return setup


@pytest.fixture
def conn(made):
    from consumers.engine import db

    connection_ = db.connect()
    yield connection_
    connection_.close()


def test_compaction_merges_runs_between_dead_letters_and_epochs_and_every_answer_stays_the_same(made, conn):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 50), 10)
    write(conn, pipeline, 0, list(range(50, 60)), value="not a number")       # every record dead-lettered
    held = set(range(0, 75)) - {62, 63}
    write(conn, pipeline, 0, [o for o in range(60, 70) if o in held], start=60, end=70)  # crossed two holes
    write(conn, pipeline, 0, list(range(70, 75)))
    Pipeline.objects.filter(pk=pipeline.pk).update(epoch=2)                   # a restart: a new epoch
    write_batches(conn, pipeline, range(75, 100), 5, epoch=2)
    write(conn, pipeline, 1, list(range(0, 5)), epoch=2)
    write(conn, pipeline, 1, list(range(5, 9)), epoch=2)
    kafka = TraceKafka({0: held | set(range(75, 100)), 1: set(range(9))}, high={0: 100, 1: 9},
                       committed={0: 100, 1: 9})
    picks = [(0, 3), (0, 55), (0, 62), (0, 66), (0, 80), (1, 7), (0, 120)]
    before = answers(pipeline, kafka, picks)
    assert before[0][:5] == (0, 0, 0, 0, 10)

    report = compact()

    assert ledger_rows(pipeline) == [(0, 50, 50, 5, 1), (50, 60, 10, 1, 1), (60, 75, 13, 2, 1), (75, 100, 25, 5, 2)]
    assert ledger_rows(pipeline, 1) == [(0, 9, 9, 2, 2)]
    assert (report.rows_merged, report.runs) == (4 + 1 + 4 + 1, 4)
    after = answers(pipeline, kafka, picks)
    assert after[:3] == before[:3]
    batch = after[3][3].batches[0]
    assert batch["compacted"] and batch["batches"] == 5 and batch["first_committed_at"] < batch["committed_at"]
    assert not after[3][55].batches[0]["compacted"]      # the dead-lettered batch keeps its row
    assert after[3][62].verdict == "no record" and after[3][62].batches[0]["compacted"]


def test_pages_and_the_api_draw_a_compacted_ledger(made, conn, admin_client):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 40), 10)
    reconcile.reconcile_pipeline(pipeline, kafka=TraceKafka({0: set(range(40))}, high={0: 40}, committed={0: 40}))
    compact()
    assert ledger_rows(pipeline) == [(0, 40, 40, 4, 1)]
    page = admin_client.get(f"/pipelines/{pipeline.name}/")
    api = admin_client.get(f"/api/pipelines/{pipeline.name}/")
    assert page.status_code == api.status_code == 200
    assert "4 batches" in page.content.decode() and "continuous" in page.content.decode()
    assert api.json()["ledger"][0] == {"partition": 0, "covered": [[0, 40]], "gaps": [], "overlaps": [],
                                             "rewinds": [], "batches": 4, "holes": 0, "holey": []}


def test_gaps_overlaps_notes_and_rewound_rows_keep_their_rows(made, conn):
    pipeline, _ = made(DeliveryMode.AT_LEAST_ONCE)
    for first in (0, 10, 20):
        write(conn, pipeline, 0, list(range(first, first + 10)))
    write(conn, pipeline, 0, list(range(40, 50)))                          # [30, 40) never written: a gap
    write(conn, pipeline, 0, list(range(50, 60)))
    write(conn, pipeline, 0, list(range(55, 65)))                          # re-read from 55: an overlap
    write(conn, pipeline, 0, list(range(65, 75)))
    write(conn, pipeline, 0, list(range(75, 85)))
    BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=85, end_offset=90, records=0,
                               rows_written=0, epoch=1, note="skipped by retention: offsets 85..89")
    write(conn, pipeline, 0, list(range(90, 100)))
    write(conn, pipeline, 0, list(range(100, 110)))
    kafka = TraceKafka({0: set(range(110))}, high={0: 110}, committed={0: 110})
    before = answers(pipeline, kafka, [(0, 5), (0, 35), (0, 57), (0, 87)])
    assert before[0][2:4] == (10, 5)                                        # the gap and the overlap

    compact()

    # The re-read batch starts a run of its own: the overlap stays between two rows, as the gap does.
    assert ledger_rows(pipeline) == [(0, 30, 30, 3, 1), (40, 60, 20, 2, 1), (55, 85, 30, 3, 1), (85, 90, 0, 1, 1),
                                     (90, 110, 20, 2, 1)]
    after = answers(pipeline, kafka, [(0, 5), (0, 35), (0, 57), (0, 87)])
    assert after[:3] == before[:3]


def test_a_rewind_with_sink_rollback_into_a_compacted_range_and_the_replay_stay_exact(made, conn):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 100), 10)
    kafka = TraceKafka({0: set(range(100))}, high={0: 100}, committed={0: 100})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    compact()
    assert ledger_rows(pipeline) == [(0, 100, 100, 10, 1)]

    # The rewind's one transaction, as consumers/operations/rewind.py runs it: roll the sink back from 45.
    Pipeline.objects.filter(pk=pipeline.pk).update(epoch=2)
    move = PartitionMove(0, 100, 45, 0, 100)
    with connection.cursor() as cursor:
        deleted = sinks.delete_rows_from(cursor, pipeline.sink_table, pipeline.topic, 0, 45)
        rewind._move_position(cursor, pipeline, move, 100, None, keep_sink=False)
    assert deleted == 55 and not LedgerSummary.objects.filter(pipeline=pipeline).exists()
    write_batches(conn, pipeline, range(45, 100), 11, epoch=2)

    result, timelines, verdicts, traced = answers(pipeline, kafka, [(0, 30), (0, 50), (0, 99)])
    assert result[:5] == (0, 0, 0, 0, 0)
    assert [f for f in result[5] if f[1] != "hole"] == []
    assert timelines == [(0, [(0, 100)], [], [], [45], 0, 15)]
    assert traced[30].batches[0]["compacted"] and not traced[30].batches[0]["superseded"]
    assert [b["superseded"] for b in traced[50].batches] == [True, False]    # the compacted row, trimmed; the replay
    assert all(t.verdict == "written" for t in traced.values())


def test_rows_of_the_recent_past_and_unverified_rows_stay_whole(made, conn):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 50), 10)
    kafka = TraceKafka({0: set(range(80))}, high={0: 80}, committed={0: 80})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    write_batches(conn, pipeline, range(50, 80), 10)  # not verified yet
    assert compaction.compact_all().rows_merged == 0                       # committed just now: kept whole
    compact()
    assert ledger_rows(pipeline) == [(0, 50, 50, 5, 1), (50, 60, 10, 1, 1), (60, 70, 10, 1, 1), (70, 80, 10, 1, 1)]
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)                    # verified now: the run grows
    compact()
    assert ledger_rows(pipeline) == [(0, 80, 80, 8, 1)]
    assert reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka).exact


def test_compaction_works_in_bounded_steps_that_resume_where_they_stopped(made, conn, monkeypatch):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 120), 4)
    write(conn, pipeline, 0, [120], value="x")                              # a dead letter closes the run
    write_batches(conn, pipeline, range(121, 141), 4)
    kafka = TraceKafka({0: set(range(141))}, high={0: 141}, committed={0: 141})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    monkeypatch.setattr(compaction, "STEP_ROWS", 7)
    report = compact()
    assert report.steps > 5
    assert ledger_rows(pipeline) == [(0, 120, 120, 30, 1), (120, 121, 1, 1, 1), (121, 141, 20, 5, 1)]
    assert LedgerSummary.objects.get(pipeline=pipeline).compacted_to == 121
    assert reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka).exact


def test_a_compaction_killed_inside_a_step_leaves_the_ledger_as_it_was(made, conn, subprocess_env):
    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 60), 6)
    kafka = TraceKafka({0: set(range(60))}, high={0: 60}, committed={0: 60})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)
    before = ledger_rows(pipeline)
    env = dict(subprocess_env, TALLY_LEDGER_KEEP_DAYS="0")

    killed = subprocess.run([sys.executable, "manage.py", "compact_ledger", "--crash-at", "compaction-mid-step@1"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert killed.returncode == -9 and "compaction-mid-step@1 fired" in killed.stderr
    assert ledger_rows(pipeline) == before           # the merged row and the deletes rolled back together
    assert reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka).exact
    done = subprocess.run([sys.executable, "manage.py", "compact_ledger", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert ledger_rows(pipeline) == [(0, 60, 60, 10, 1)]
    assert PartitionHealth.objects.get(pipeline=pipeline).verified_offset == 60
    assert reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka).exact


@pytest.mark.celery
def test_the_beat_task_compacts_on_a_real_worker(made, conn, celery_worker):
    from consumers.tasks.reconciliation import compact_ledger_task

    pipeline, _ = made()
    write_batches(conn, pipeline, range(0, 30), 5)
    BatchLedger.objects.filter(pipeline=pipeline).update(committed_at=compaction.database_now() - LATER)  # old
    kafka = TraceKafka({0: set(range(30))}, high={0: 30}, committed={0: 30})
    reconcile.reconcile_pipeline(pipeline, kafka=kafka)

    done = compact_ledger_task.delay().get(timeout=60)

    assert (done["rows_merged"], done["runs"], done["unfinished"]) == (5, 1, False)   # six rows, one kept
    assert ledger_rows(pipeline) == [(0, 30, 30, 6, 1)]
    assert reconcile.reconcile_pipeline(pipeline, full=True, kafka=kafka).exact
