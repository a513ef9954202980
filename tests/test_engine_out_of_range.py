"""Retention passing a running exactly-once pipeline is never skipped silently. Its consumer has no reset policy
("none"): Kafka answering out of range is not a jump to the log start (or end) the client makes on its own, but a
seek back to the database, where log_bounds stops the run or skips with a ledger note, as the pipeline's policy
says. The embedded broker deletes nothing, so a stand-in in front of the real consumer answers as Kafka does for a
log whose start retention moves to LOG_START once the run has sought its positions (at its first poll), and the
watermarks say the same; the records, the engine and PostgreSQL are real."""
import pytest
from kafka import TopicPartition
from kafka.errors import OffsetOutOfRangeError

from consumers.engine import python as engine
from consumers.engine.consumer import KafkaPythonConsumer, PositionOutOfRange
from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka.admin import Watermarks
from consumers.models import BatchLedger, DeliveryMode, LogTruncatedPolicy, PartitionOffset
from tests.chaos import sink_counts
from tests.pipelines import create_pipeline
from tests.views_helpers import drop_sink, produce

LOG_START = 4


class Log:
    start = 0   # the log start Kafka reports; retention moves it


class RetainedFrom:
    """The real consumer, except that retention moves the log start to LOG_START at the first poll, and a fetch
    from below the log start is answered out of range, as Kafka does."""

    def __init__(self, real, log: Log):
        self.real, self.log, self.refused = real, log, 0

    def poll(self, timeout_ms, max_records):
        self.log.start = LOG_START
        behind = [p for p in self.real.assignment() if (self.real.position(p) or 0) < self.log.start]
        if behind:
            self.refused += 1
            raise PositionOutOfRange(behind, "below the log start")
        return self.real.poll(timeout_ms, max_records)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def retained(kafka_bootstrap, make_topic, monkeypatch, transactional_db):
    """make(policy, mode) -> (pipeline, consumers made, reset policies asked for) over 10 records of which
    retention deletes the first LOG_START while the run reads."""
    topic = make_topic("retained")
    produce(kafka_bootstrap, topic, [str(v) for v in range(1, 11)])
    made, policies, tables, log = [], [], [], Log()
    real_make, real_watermarks = engine.make_consumer, kafka_admin.watermarks

    def make_consumer(*args, reset_policy, **kwargs):
        policies.append(reset_policy)
        made.append(RetainedFrom(real_make(*args, reset_policy=reset_policy, **kwargs), log))
        return made[-1]

    def watermarks(*args, **kwargs):
        return {p: Watermarks(max(mark.log_start, log.start), mark.high)
                for p, mark in real_watermarks(*args, **kwargs).items()}

    monkeypatch.setattr(engine, "make_consumer", make_consumer)
    monkeypatch.setattr(kafka_admin, "watermarks", watermarks)

    def make(policy, mode=DeliveryMode.EXACTLY_ONCE):
        table = f"retained_{len(tables)}"
        tables.append(table)
        pipeline = create_pipeline(f"retained-{len(tables)}", topic, table, delivery_mode=mode, on_log_truncated=policy)
        return pipeline, made, policies

    yield make
    for table in tables:
        drop_sink(table)


def test_by_default_the_run_stops_naming_the_deleted_offsets_and_moves_nothing(retained):
    pipeline, made, policies = retained(LogTruncatedPolicy.STOP)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "error"
    assert f"offsets 0..{LOG_START - 1} were deleted before they were read" in result.detail
    assert policies == ["none"] and made[0].refused == 1
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 0
    assert sink_counts(pipeline.sink_table) == {} and not BatchLedger.objects.filter(pipeline=pipeline).exists()


def test_the_skip_policy_skips_with_a_ledger_note_and_reads_the_rest_once(retained):
    pipeline, made, _ = retained(LogTruncatedPolicy.SKIP)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(LOG_START + 1, 11)}
    note = BatchLedger.objects.get(pipeline=pipeline, records=0)
    assert (note.first_offset, note.end_offset, note.note) == (0, LOG_START, "skipped by retention: offsets 0..3")
    assert made[0].refused == 1
    assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 10


def test_the_classic_modes_keep_the_pipelines_own_reset_policy(retained):
    pipeline, _, policies = retained(LogTruncatedPolicy.STOP, DeliveryMode.AT_LEAST_ONCE)
    run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=5)
    assert policies == [pipeline.reset_policy] == ["earliest"]


class RefusingKafka:
    def poll(self, timeout_ms, max_records):
        raise OffsetOutOfRangeError({TopicPartition("t", 2): 7})


def test_kafka_pythons_out_of_range_answer_is_the_engines_position_out_of_range():
    with pytest.raises(PositionOutOfRange, match=r"partition\(s\) 2: .*p2 at 7") as refused:
        KafkaPythonConsumer(RefusingKafka(), "t").poll(200, 10)
    assert refused.value.partitions == [2]


class Message:
    def __init__(self, error):
        self._error = error

    def error(self):
        return self._error

    def partition(self):
        return 3


@pytest.mark.parametrize("code", ["_AUTO_OFFSET_RESET", "OFFSET_OUT_OF_RANGE"])
def test_librdkafkas_out_of_range_error_is_the_engines_position_out_of_range(code):
    ck = pytest.importorskip("confluent_kafka", reason="the librdkafka client is the extra tally[rdkafka]")
    from consumers.engine.rdkafka import RdKafkaConsumer

    client = RdKafkaConsumer.__new__(RdKafkaConsumer)   # its error mapping alone: no broker, no librdkafka handle
    client._ck = ck
    with pytest.raises(PositionOutOfRange) as refused:
        client._message_error(Message(ck.KafkaError(getattr(ck.KafkaError, code))))
    assert refused.value.partitions == [3]
