"""The run life cycle both engines share (consumers/engine/lifecycle.py): the run row, fencing, the outcome of a
reason, and when Kafka's copy of the positions is committed. Real PostgreSQL; Kafka's consumer is a stand-in
that records the commits (the engines' tests run the same code against the real broker)."""
import pytest

from consumers.engine import commit, lifecycle
from consumers.engine.lifecycle import RUN_STATE, KafkaPositions, Run, RunEnded, UnknownPipeline, load_pipeline
from consumers.models import ConsumerRun, DeliveryMode, Engine, Pipeline, RunState


class RecordingConsumer:
    """The engine's consumer interface (consumers/engine/consumer.py), recording each commit as
    (how, {partition: offset}); refuses them all when `fail` is set."""

    def __init__(self, fail=False):
        self.commits, self.fail = [], fail

    def commit(self, ends, *, wait):
        if self.fail:
            raise RuntimeError("the coordinator moved")
        self.commits.append(("sync" if wait else "async", dict(ends)))


class RecordingKafkaConsumer:
    """kafka-python's KafkaConsumer as the group-less committer sees it, recording into a RecordingConsumer."""

    def __init__(self, into: RecordingConsumer):
        self.into = into

    def commit(self, offsets, timeout_ms=None):
        self.into.commit({tp.partition: meta.offset for tp, meta in offsets.items()}, wait=True)


def _outcome(partition, end, records):
    return commit.PartitionOutcome(partition, end - records, end, records, records, 0, 0)


@pytest.fixture
def pipeline(transactional_db):   # the process's beat writes heartbeats on a connection of its own
    return Pipeline.objects.create(name="life", topic="nums", sink_table="life_sink", epoch=3)


def test_a_run_counts_outcomes_and_ends_with_the_state_of_its_reason(pipeline):
    run = Run(pipeline, Engine.SPARK, task_id="t-1", state=RunState.STARTING)
    run.mark_running()
    run.records_arrived()
    assert run.count([_outcome(0, 10, 10), _outcome(1, 4, 0)]) == {0: 10, 1: 4}
    assert run.count([_outcome(1, 6, 2)]) == {1: 6}
    result = run.finish("bad_record", "offset 7: not a number")
    row = ConsumerRun.objects.get(pk=run.row.pk)
    assert (row.state, row.end_reason, row.records_processed, row.engine) == (
        RunState.FAILED, "bad_record: offset 7: not a number", 12, Engine.SPARK)
    assert (result.records, result.batches, result.run_id, result.epoch, result.ok) == (12, 2, row.pk, 3, False)
    assert result.busy_seconds >= 0 and result.seconds >= result.busy_seconds
    pipeline.refresh_from_db()
    assert pipeline.last_error == "halted (bad_record): offset 7: not a number"


@pytest.mark.parametrize("reason,state", sorted(RUN_STATE.items()))
def test_every_reason_has_one_run_state_and_only_halts_touch_the_pipeline(pipeline, reason, state):
    run = Run(pipeline, Engine.PYTHON)
    run.finish(reason, "why")
    assert ConsumerRun.objects.get(pk=run.row.pk).state == state
    pipeline.refresh_from_db()
    assert bool(pipeline.last_error) == (reason in ("bad_record", "sink_error"))


def test_the_heartbeat_records_progress_and_a_newer_epoch_or_a_deleted_pipeline_fences_the_run(pipeline):
    run = Run(pipeline, Engine.PYTHON)
    assert run.heartbeat([2, 0], force=True)
    assert ConsumerRun.objects.get(pk=run.row.pk).assigned_partitions == [0, 2]
    assert not run.heartbeat([1])      # within the interval: handed to the beat, not waited for
    run.heartbeat(force=True)          # waits for a beat that carries it
    assert ConsumerRun.objects.get(pk=run.row.pk).assigned_partitions == [1]
    pipeline.bump_epoch()
    with pytest.raises(RunEnded, match="moved to epoch 4") as ended:
        run.heartbeat(force=True)
    assert ended.value.reason == "fenced"
    Pipeline.objects.filter(pk=pipeline.pk).delete()
    with pytest.raises(RunEnded, match="deleted"):
        run.heartbeat(force=True)
    run.finish("fenced", "the pipeline was deleted")   # leaves the process's beat


@pytest.mark.parametrize("refused,reason,detail", [
    (commit.Fenced("epoch 2 < 3"), "fenced", "epoch 2 < 3"),
    (commit.StopOnBadRecord("offset 4"), "bad_record", "offset 4"),
    (commit.SinkError("permission denied"), "sink_error", "permission denied"),
    (commit.Gap("starts at 9, stored 5"), "error", "Gap: starts at 9, stored 5"),
    (commit.CommitRefused("moved meanwhile"), "error", "moved meanwhile"),
])
def test_a_refused_batch_ends_the_run_with_the_reason_of_its_refusal(refused, reason, detail):
    ended = RunEnded.refused(refused.reason, str(refused))
    assert (ended.reason, ended.detail) == (reason, detail)


@pytest.mark.django_db
def test_an_unknown_pipeline_is_refused_by_name():
    with pytest.raises(UnknownPipeline, match="'nope'"):
        load_pipeline("nope")


def _positions(pipeline, mode, consumer=None):
    """Kafka's copy of a run's positions at the pipeline's epoch: a commit waited for checks that epoch."""
    Pipeline.objects.filter(pk=pipeline.pk).update(group_id="g", delivery_mode=mode)
    pipeline.refresh_from_db()
    return KafkaPositions(pipeline, consumer)


def test_exactly_once_commits_asynchronously_through_the_runs_own_consumer_and_once_synchronously_at_a_clean_end(
        pipeline):
    consumer = RecordingConsumer()
    kafka = _positions(pipeline, DeliveryMode.EXACTLY_ONCE, consumer)
    kafka.after_db_commit({0: 10})
    kafka.after_db_commit({1: 4})
    kafka.finish("caught_up")
    kafka.finish("stopped")   # confirmed: nothing more to send
    assert consumer.commits == [("async", {0: 10}), ("async", {1: 4}), ("sync", {0: 10, 1: 4})]


def test_a_fenced_run_leaves_kafka_as_its_last_commits_left_it(pipeline):
    consumer = RecordingConsumer()
    kafka = _positions(pipeline, DeliveryMode.EXACTLY_ONCE, consumer)
    kafka.after_db_commit({0: 10})
    kafka.finish("fenced")
    assert consumer.commits == [("async", {0: 10})]


def test_at_least_once_and_a_group_less_committer_wait_for_each_commit(pipeline, monkeypatch):
    member = RecordingConsumer()
    at_least_once = _positions(pipeline, DeliveryMode.AT_LEAST_ONCE, member)
    at_least_once.after_db_commit({0: 10})
    at_least_once.finish("stopped")
    assert member.commits == [("sync", {0: 10})]
    opened = []   # an engine without a consumer of its own (Spark's driver): one is opened on first use
    monkeypatch.setattr(lifecycle.clusters, "consumer",
                        lambda cluster, **config: opened.append(config) or RecordingKafkaConsumer(member))
    group_less = _positions(pipeline, DeliveryMode.EXACTLY_ONCE)
    group_less.after_db_commit({0: 7})
    group_less.after_db_commit({0: 9})
    group_less.finish("stopped")
    assert member.commits[1:] == [("sync", {0: 7}), ("sync", {0: 9})]
    assert len(opened) == 1 and opened[0]["group_id"] == "g" and not opened[0]["enable_auto_commit"]


@pytest.mark.parametrize("mode", [DeliveryMode.AT_LEAST_ONCE, DeliveryMode.AT_MOST_ONCE])
def test_a_run_of_an_older_epoch_commits_nothing_to_kafka_and_ends_fenced(pipeline, mode):
    # The classic modes resume from Kafka: a run that a rewind's pause fenced (frozen past its lease, then woken)
    # must not put its old positions back over the rewind's.
    consumer = RecordingConsumer()
    kafka = _positions(pipeline, mode, consumer)
    pipeline.bump_epoch()
    with pytest.raises(RunEnded, match="writer epoch 3 is fenced") as ended:
        kafka.before_write({0: 10}) if mode == DeliveryMode.AT_MOST_ONCE else kafka.after_db_commit({0: 10})
    assert ended.value.reason == "fenced"
    kafka.finish("stopped")   # a clean end's last commit is skipped, not raised
    assert consumer.commits == []


def test_a_failed_advisory_commit_is_retried_at_a_clean_end(pipeline):
    consumer = RecordingConsumer(fail=True)
    kafka = _positions(pipeline, DeliveryMode.AT_LEAST_ONCE, consumer)
    kafka.after_db_commit({0: 10})   # logged, not raised: the DB holds the position
    consumer.fail = False
    kafka.finish("stopped")
    assert consumer.commits == [("sync", {0: 10})]


def test_at_most_once_commits_before_the_write_only_and_never_writes_without_it(pipeline):
    consumer = RecordingConsumer()
    kafka = _positions(pipeline, DeliveryMode.AT_MOST_ONCE, consumer)
    kafka.before_write({0: 10})
    kafka.after_db_commit({0: 10})   # the position was Kafka's already
    kafka.finish("stopped")
    assert consumer.commits == [("sync", {0: 10})]
    consumer.fail = True
    with pytest.raises(RunEnded, match="not written") as ended:
        kafka.before_write({0: 20})
    assert ended.value.reason == "error"
