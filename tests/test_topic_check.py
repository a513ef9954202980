"""The topic check: the classic example (`nums`) in all three delivery modes, a table with both lost and
duplicated keys checked against plain SQL, the pure compare() step on tiny DataFrames, the CLI and the
stored job (the Celery job is in test_topic_check_job.py)."""
import json
import random
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from psycopg2 import sql

from consumers.engine import commit, db, sinks
from consumers.engine.spark_session import get_spark
from consumers.engine.transforms import SourceRecord, resolve
from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult, DeliveryMode, Pipeline, TopicCheckJob, TopicCheckStatus
from consumers.reconciliation import topic_check
from tests.producing import numbered, send
from tests.spark_helpers import insert_order_ids, plain_sql_check

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

VALUES = 100        # the classic example: "1".."100"
PARTITIONS = 2


@pytest.fixture
def spark():
    return get_spark()  # one per process, reused (rebuilt only if a test ended the JVM)


def produce_nums(bootstrap, topic, count=VALUES, partitions=PARTITIONS) -> dict[int, list[int]]:
    """Values 1..count, value v to partition (v-1) % partitions; returns each partition's values in offset order."""
    send(topic, numbered(count, partitions), bootstrap=bootstrap)
    return {p: list(range(p + 1, count + 1, partitions)) for p in range(partitions)}


def records(log, partition, offsets):
    return [SourceRecord(partition, o, None, str(log[partition][o]).encode()) for o in offsets]


@pytest.fixture
def classic(transactional_db, kafka_bootstrap, make_topic):
    """A `nums` topic and a pipeline per delivery mode with its sink table; tables dropped afterwards."""
    topic = make_topic("nums", partitions=PARTITIONS)
    log = produce_nums(kafka_bootstrap, topic)
    conn = db.connect()
    made = []

    def pipeline(mode):
        p = Pipeline.objects.create(name=f"nums-{mode}".replace("_", "-"), topic=topic,
                                    group_id=f"{topic}-{mode}", sink_table=f"check_nums_{mode}",
                                    delivery_mode=mode, epoch=1)
        with connection.cursor() as cur:
            sinks.ensure_sink_table(cur, p.sink_table, resolve("int_value"), p.is_exactly_once)
        made.append(p.sink_table)
        return p, commit.Target.for_pipeline(p)

    yield topic, log, conn, pipeline
    conn.close()
    with connection.cursor() as cur:
        for table in made:
            sinks.drop_sink_table(cur, table)


def run_topic_check(pipeline, **kwargs):
    return topic_check.check_topic(pipeline.topic, pipeline.group_id, pipeline.sink_table, "id", "int_value",
                       pipeline=pipeline, **kwargs)


def test_exactly_once_finds_nothing_missing_duplicated_or_unexpected(spark, classic):
    topic, log, conn, make = classic
    pipeline, target = make(DeliveryMode.EXACTLY_ONCE)
    commit.ensure_positions(conn, pipeline.pk, {0: 0, 1: 0})
    for start in range(0, 50, 10):
        # A replayed batch after a crash: the protocol skips what is already written.
        commit.commit_batch(conn, target, 1, {p: records(log, p, range(max(0, start - 5), start + 10))
                                              for p in range(PARTITIONS)})
    report = run_topic_check(pipeline)
    assert report["offsets_source"] == "tally"
    assert (report["records_read"], report["rows_read"]) == (VALUES, VALUES)
    assert (report["missing_count"], report["duplicated_count"], report["unexpected_count"]) == (0, 0, 0)
    assert (report["missing"], report["duplicated"], report["unexpected"]) == ([], {}, [])


def test_at_most_once_with_crashes_names_exactly_the_lost_values(spark, classic):
    topic, log, conn, make = classic
    pipeline, target = make(DeliveryMode.AT_MOST_ONCE)
    lost = {0: range(10, 20), 1: range(30, 35)}  # Kafka committed these batches, then the consumer died
    for p in range(PARTITIONS):
        for start in range(0, 50, 5):
            batch = range(start, start + 5)
            if not set(batch) & set(lost[p]):
                commit.commit_batch(conn, target, 1, {p: records(log, p, batch)})
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 50, 1: 50})
    report = run_topic_check(pipeline)
    expected = sorted(log[p][o] for p in lost for o in lost[p])
    assert report["offsets_source"] == "kafka"
    assert report["missing"] == expected and report["missing_count"] == len(expected) == 15
    assert (report["duplicated_count"], report["unexpected_count"]) == (0, 0)


def test_at_least_once_with_crashes_names_the_values_written_twice(spark, classic):
    topic, log, conn, make = classic
    pipeline, target = make(DeliveryMode.AT_LEAST_ONCE)
    for start in range(0, 50, 10):
        commit.commit_batch(conn, target, 1, {0: records(log, 0, range(start, start + 10))})
    # Crash after the DB commit, before the Kafka commit: the batch is consumed and written again.
    commit.commit_batch(conn, target, 1, {0: records(log, 0, range(20, 30))})
    commit.commit_batch(conn, target, 1, {1: records(log, 1, range(0, 50))})
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 50, 1: 50})
    report = run_topic_check(pipeline)
    assert report["duplicated"] == {str(log[0][o]): 2 for o in range(20, 30)}
    assert report["duplicated_count"] == 10 and report["extra_rows"] == 10
    assert (report["missing_count"], report["unexpected_count"]) == (0, 0)


def test_lost_and_duplicated_keys_agree_with_a_plain_sql_count(spark, kafka_bootstrap, make_topic, orders_table):
    topic = make_topic("orders", partitions=3)
    produce_nums(kafka_bootstrap, topic, count=2000, partitions=3)
    committed = {0: 600, 1: 667, 2: 500}  # the group has not consumed everything
    kafka_admin.commit_offsets("orders-loader", topic, committed)
    consumed = [v for p, end in committed.items() for v in range(p + 1, 2001, 3)[:end]]
    rng = random.Random(8)
    written = [v for v in consumed if rng.random() > 0.03]               # some lost
    written += rng.sample(written, 40) + rng.sample(written, 5)          # some written twice or three times
    written += [5001, 5002]                                              # never in the topic
    insert_order_ids(orders_table, written)

    report = topic_check.check_topic(topic, "orders-loader", orders_table, "order_id", "int_value")

    missing, duplicated, unexpected = plain_sql_check(orders_table, consumed)
    assert report["records_read"] == sum(committed.values()) == len(consumed)
    assert report["missing_count"] == missing > 0
    assert report["duplicated"] == {str(k): n for k, n in duplicated.items()} and len(duplicated) > 0
    assert report["unexpected_count"] == unexpected == 2 and report["unexpected"] == [5001, 5002]
    assert report["rows_read"] == len(written)


def test_compare_classifies_each_key_on_tiny_dataframes(spark):
    consumed = spark.createDataFrame([(k,) for k in [1, 2, 3, 4, 4, 5, None, None]], "key bigint")
    written = spark.createDataFrame([(1, 1), (3, 2), (4, 2), (5, 3), (9, 1)], "key bigint, written bigint")
    rows = {r.key: (r.consumed, r.written, r.finding) for r in topic_check.compare(consumed, written).collect()}
    assert rows == {1: (1, 1, None), 2: (1, 0, "missing"), 3: (1, 2, "duplicated"),
                    4: (2, 2, None),  # consumed twice, written twice: right
                    5: (1, 3, "duplicated"), 9: (0, 1, "unexpected"), None: (2, 0, "unparsable")}
    report = topic_check.summarize(topic_check.compare(consumed, written))
    assert {k: report[k] for k in ("missing_count", "duplicated_count", "unexpected_count", "unparsable_count",
                                   "records_read", "rows_read", "distinct_keys_consumed", "extra_rows")} == {
        "missing_count": 1, "duplicated_count": 2, "unexpected_count": 1, "unparsable_count": 2,
        "records_read": 8, "rows_read": 9, "distinct_keys_consumed": 5, "extra_rows": 3}
    assert (report["missing"], report["duplicated"], report["unexpected"]) == ([2], {"3": 2, "5": 3}, [9])


def test_the_value_parsers_map_records_to_keys(spark):
    frame = spark.createDataFrame([(b"k1", b' 42 '), (b"k2", b'{"id": 7, "kind": "x"}'), (b"k3", b"1,2")],
                                  "key binary, value binary")
    assert [r.key for r in topic_check.VALUE_PARSERS["int_value"](frame).collect()] == [42, None, None]
    assert [r.key for r in topic_check.VALUE_PARSERS["json_id"](frame).collect()] == [None, 7, None]
    # a record with a part that is not an integer (the JSON value, split at its comma) is one unparsable record
    assert [r.key for r in topic_check.VALUE_PARSERS["csv_ints"](frame).collect()] == [42, None, 1, 2]
    assert [r.key for r in topic_check.VALUE_PARSERS["record_key"](frame).collect()] == ["k1", "k2", "k3"]


@pytest.mark.parametrize("value", [b"1,x,3", b"4,,5", b"", None])
def test_a_csv_record_the_transform_makes_a_dead_letter_of_is_one_unparsable_record(spark, value):
    """Not its parts that are integers: no row holds them, and they would be reported missing."""
    with pytest.raises(Exception, match="not a comma-separated list"):
        resolve("csv_ints").rows(SourceRecord(0, 0, None, value))
    frame = spark.createDataFrame([(None, value)], "key binary, value binary")
    assert [r.key for r in topic_check.VALUE_PARSERS["csv_ints"](frame).collect()] == [None]


# Values the transforms take or refuse (int() decides); the parsers must read each record as they do.
INT_TEXTS = [b"42", b" 42 ", b"42\n", b"\t-7", b"+7", b"007", b"1_000", b"1__0", b"_1", b"1_", b"4 2", b"x", b"",
             b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808", b"1.5", b"0x10"]


def python_keys(transform, value):
    try:
        return [row[0] for row in resolve(transform).rows(SourceRecord(0, 0, None, value))]
    except Exception:  # noqa: BLE001 - any failure of a transform is a dead letter
        return [None]   # one unparsable record


def test_the_parsers_read_integers_as_the_transforms_do(spark):
    texts = INT_TEXTS + [b"1, 2", b"1,_2", b"3 ,4_0"]
    frame = spark.createDataFrame([(None, value) for value in texts], "key binary, value binary")
    for transform, parser in (("int_value", "int_value"), ("csv_ints", "csv_ints")):
        spark_keys = [r.key for r in topic_check.VALUE_PARSERS[parser](frame).collect()]
        # PostgreSQL refuses what bigint cannot hold: a dead letter, as the null key is unparsable
        expected = [k if k is None or -2**63 <= k < 2**63 else None
                    for value in texts for k in python_keys(transform, value)]
        assert spark_keys == expected, transform


def test_a_table_holding_bigints_largest_value_is_read_whole(spark, orders_table):
    """Spark's JDBC upper bound was the highest key plus one: a long overflow at 2**63 - 1."""
    insert_order_ids(orders_table, [-2**63, 1, 2**63 - 1, 2**63 - 1])
    written = topic_check.extract_written(spark, orders_table, "order_id")
    assert sorted((r["key"], r["written"]) for r in written.collect()) == [(-2**63, 1), (1, 1), (2**63 - 1, 2)]
    from consumers.reconciliation import watch_spark  # a watch's audit reads a team's table the same way

    conn = db.connect()
    try:
        with conn.cursor() as cur:
            assert watch_spark.read_team(spark, cur, orders_table, ["order_id"], False).count() == 4
    finally:
        conn.close()


def test_an_exactly_once_pipeline_that_started_at_the_log_end_is_checked_from_its_first_batch(
        spark, kafka_bootstrap, make_topic, transactional_db):
    """Reset policy latest: the records before its first position were never the pipeline's to consume."""
    topic = make_topic("late", partitions=2)
    send(topic, numbered(20, partitions=2), bootstrap=kafka_bootstrap)   # 10 per partition before it starts
    pipeline = Pipeline.objects.create(name="late", topic=topic, sink_table="late_sink", reset_policy="latest",
                                       epoch=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 10, 1: 10})
        send(topic, [(0, None, str(v).encode()) for v in range(21, 26)], bootstrap=kafka_bootstrap)
        commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1,
                            {0: [SourceRecord(0, 10 + i, None, str(21 + i).encode()) for i in range(5)]})
        consumed = topic_check.consumed_range(topic, pipeline.group_id, pipeline)
        assert (consumed.start, consumed.end, consumed.source) == ({0: 10, 1: 10}, {0: 15, 1: 10}, "tally")
        report = topic_check.check_topic(topic, pipeline.group_id, pipeline.sink_table, "id", "int_value",
                                         pipeline=pipeline)
        assert (report["records_read"], report["missing_count"], report["unexpected_count"]) == (5, 0, 0)
    finally:
        conn.close()
        with connection.cursor() as cur:
            sinks.drop_sink_table(cur, pipeline.sink_table)


def test_an_unknown_table_or_column_is_a_clear_error(spark, orders_table):
    with pytest.raises(topic_check.TopicCheckError, match="does not exist"):
        topic_check.written_keys_query("no_such_table", "id")
    with pytest.raises(topic_check.TopicCheckError,
                       match=r"Cannot read column 'nope' of table '.*' \(UndefinedColumn\)\.$"):
        topic_check.written_keys_query(orders_table, "nope")


def test_the_topic_check_command_prints_the_report_as_json_and_stores_the_job(spark, classic):
    topic, log, conn, make = classic
    pipeline, target = make(DeliveryMode.AT_MOST_ONCE)
    commit.commit_batch(conn, target, 1, {0: records(log, 0, range(0, 50)), 1: records(log, 1, range(0, 40))})
    kafka_admin.commit_offsets(pipeline.group_id, topic, {0: 50, 1: 50})
    out = StringIO()
    with pytest.raises(CommandError, match="Not exact: 10 missing, 0 duplicated") as not_exact:
        call_command("topic_check", pipeline.name, "--json", stdout=out)
    assert not_exact.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["missing"] == [log[1][o] for o in range(40, 50)] and report["missing_count"] == 10
    job = TopicCheckJob.objects.get()
    assert (job.status, job.pipeline, job.requested_by, job.progress) == (TopicCheckStatus.DONE, pipeline, "cli", 1.0)
    assert job.result == report


def test_a_topic_check_of_a_pipeline_whose_transform_has_no_parser_is_refused_before_it_is_queued(transactional_db):
    pipeline = Pipeline.objects.create(name="custom", topic="t", sink_table="custom_sink",
                                       transform="myapp.transforms.orders")
    with pytest.raises(topic_check.TopicCheckError, match="has no Spark topic check parser"):
        topic_check.request_topic_check(pipeline)
    with pytest.raises(CommandError, match="has no Spark topic check parser"):
        call_command("topic_check", "custom")
    with pytest.raises(CommandError, match="Refused: No pipeline named 'auth_user'") as unknown:
        call_command("topic_check", "auth_user")
    assert unknown.value.returncode == 1
    assert not TopicCheckJob.objects.exists()
    # audited, as the page and the API audit theirs
    refusals = ActionLog.objects.filter(action="topic_check", result=ActionResult.REFUSED).order_by("pk")
    assert [(r.actor, r.pipeline and r.pipeline.name) for r in refusals] == [("cli", "custom"), ("cli", None)]


def test_a_topic_check_reads_its_pipelines_table_and_key_whatever_the_job_row_says(transactional_db):
    pipeline = Pipeline.objects.create(name="events", topic="ev", group_id="ev-g", sink_table="events_sink",
                                       transform="json_event")
    spec = topic_check.topic_check_spec(pipeline)
    assert (spec.topic, spec.group_id, spec.table, spec.key_column, spec.value_parser) == (
        "ev", "ev-g", "events_sink", "id", "json_id")
    job = topic_check.create_job(pipeline, requested_by="otto")
    TopicCheckJob.objects.filter(pk=job.pk).update(table="auth_user", key_column="password")  # a tampered row
    seen = {}

    def fake_check(topic, group_id, table, key_column, parser, **kwargs):
        seen.update(table=table, key_column=key_column)
        raise RuntimeError("value 'hunter2' of auth_user.password cannot be cast")  # Spark quoting a value

    original, topic_check.check_topic = topic_check.check_topic, fake_check
    try:
        job = topic_check.run_topic_check_job(job.pk)
    finally:
        topic_check.check_topic = original
    assert seen == {"table": "events_sink", "key_column": "id"}
    assert job.status == TopicCheckStatus.FAILED and "hunter2" not in job.error and "worker's log" in job.error


def test_sql_identifiers_in_the_jdbc_query_are_quoted(transactional_db):
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} ({} bigint)").format(sql.Identifier("Odd Table"), sql.Identifier("Key")))
    try:
        query = topic_check.written_keys_query("Odd Table", "Key")
        assert query.startswith('SELECT "Key" AS key, count(*) AS written FROM "Odd Table"')
    finally:
        with connection.cursor() as cur:
            cur.execute('DROP TABLE "Odd Table"')
