"""Dead-letter replay and discard (consumers.operations.dead_letters) against the real PostgreSQL: dead letters made
by the commit protocol become sink rows through the pipeline's current transform, exactly once, in one
transaction with their removal, a replay-ledger row and the action log entry."""
import pytest
from django.db import connection
from kafka import KafkaProducer
from psycopg2 import sql

from consumers.engine import commit, db
from consumers.engine.python import run_pipeline
from consumers.engine.transforms import SourceRecord
from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay, DeliveryMode, Pipeline
from consumers.operations import dead_letters
from consumers.operations.errors import Refused
from consumers.reconciliation import verify as reconcile_verify
from tests.pipelines import create_pipeline

BAD = {3: "x3", 7: "7?", 8: "junk"}   # int_value rejects these; lenient_int accepts "x3" and "7?", never "junk"


def values(count, bad=BAD):
    return {o: bad.get(o, str(o + 1)) for o in range(count)}


def consume(pipeline, by_partition):
    """Commit {partition: {offset: value}} through the commit protocol, as an engine would."""
    conn = db.connect("tally-tests")
    try:
        commit.ensure_positions(conn, pipeline.pk, {p: 0 for p in by_partition})
        target = commit.Target.for_pipeline(pipeline)
        commit.commit_batch(conn, target, pipeline.epoch, {
            p: [SourceRecord(p, o, f"k{o}".encode(), v.encode()) for o, v in sorted(offsets.items())]
            for p, offsets in by_partition.items()})
    finally:
        conn.close()


def rows_in_provenance_order(pipeline):
    """[(partition, offset, row index, id)] of the sink, in provenance order (a fresh connection)."""
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cur:
            row = sql.SQL("source_row") if "csv" in pipeline.transform else sql.SQL("0")
            cur.execute(sql.SQL("SELECT source_partition, source_offset, {}, id FROM {} ORDER BY 1, 2, 3").format(
                row, sql.Identifier(pipeline.sink_table)))
            rows = cur.fetchall()
        conn.rollback()
    finally:
        conn.close()
    return rows


def verify(pipeline, partition, end):
    """Reconciliation's check of [0, end) of a partition (the ledger taken as whole)."""
    conn = db.connect("tally-tests")
    try:
        with conn.cursor() as cur:
            shape = reconcile_verify.sink_shape(cur, pipeline.sink_table, pipeline.topic, "csv" in pipeline.transform)
            return reconcile_verify.verify_range(cur, shape, pipeline.pk, partition, 0, end, [(0, end)])
    finally:
        conn.close()


@pytest.fixture
def pipeline(transactional_db):
    created = []

    def make(name="orders", transform="int_value", mode=DeliveryMode.EXACTLY_ONCE):
        made = create_pipeline(name, f"{name}-topic", f"sink_{name}".replace("-", "_"), transform, mode, epoch=1)
        created.append(made.sink_table)
        return made

    yield make
    from tests.conftest import drop_sink_tables
    drop_sink_tables(created)


def fix_transform(pipeline, name="tests.replay_transforms.lenient_int"):
    Pipeline.objects.filter(pk=pipeline.pk).update(transform=name)
    pipeline.refresh_from_db()


def test_a_replay_turns_fixed_dead_letters_into_sink_rows_and_keeps_the_still_bad_ones(pipeline):
    orders = pipeline()
    consume(orders, {0: values(10)})
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == [3, 7, 8]
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    result = dead_letters.replay(orders, ids, actor="otto")

    assert result.counts == {"replayed": 2, "still_bad": 1}
    assert rows_in_provenance_order(orders) == [(0, o, 0, {3: 3, 7: 7}.get(o, o + 1)) for o in range(10) if o != 8]
    bad = DeadLetter.objects.get()
    assert (bad.offset, bad.replay_attempts) == (8, 1)
    assert bad.error.startswith("BadRecord: no digits")
    replays = DeadLetterReplay.objects.order_by("offset")
    assert [(r.offset, r.rows_written, r.actor, r.source) for r in replays] == [(3, 1, "otto", "stored"),
                                                                              (7, 1, "otto", "stored")]
    assert replays[0].original_error.startswith("BadRecord: value is not an integer")
    entry = ActionLog.objects.get(action="replay_dead_letters")
    assert (entry.actor, entry.result, entry.pipeline_id) == ("otto", ActionResult.DONE, orders.pk)
    assert replays[0].action_log_id == entry.pk
    # Reconciliation still finds exactly one outcome per offset: rows, or the dead letter left.
    checked = verify(orders, 0, 10)
    assert (checked.lost, checked.duplicated, checked.dead_lettered, checked.proven) == (0, 0, 1, True)


def test_a_replay_moves_the_reconciliation_mark_back_to_the_batch_of_the_first_replayed_offset(pipeline):
    from consumers.models import PartitionHealth

    orders = pipeline()
    consume(orders, {0: values(10)})
    PartitionHealth.objects.create(pipeline=orders, partition=0, verified_offset=10, next_offset=10,
                                   findings=[{"kind": "dead_letter", "start": 3, "end": 4, "count": 1}])
    fix_transform(orders)
    dead_letters.replay(orders, list(DeadLetter.objects.filter(offset__in=[7, 8]).values_list("pk", flat=True)),
                        actor="otto")
    # 8 stayed a dead letter; 7 lies in the one batch [0, 10), which is verified again whole (its holes counted by
    # its ledger row: tests/test_reconcile_holes.py)
    assert PartitionHealth.objects.get(pipeline=orders).verified_offset == 0


def test_replaying_twice_writes_each_row_once(pipeline):
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    ids = list(DeadLetter.objects.values_list("pk", flat=True))
    dead_letters.replay(orders, ids, actor="otto")
    again = dead_letters.replay(orders, ids, actor="otto")
    assert again.counts == {"gone": 2, "still_bad": 1}
    assert [(p, o) for p, o, _, _ in rows_in_provenance_order(orders)] == [(0, o) for o in range(10) if o != 8]
    assert DeadLetterReplay.objects.count() == 2


def test_a_dead_letter_whose_rows_the_sink_already_holds_is_removed_without_a_second_row(pipeline):
    orders = pipeline()
    consume(orders, {0: values(5)})
    fix_transform(orders)
    letter = DeadLetter.objects.get(offset=3)
    with connection.cursor() as cur:  # as if a rewind re-read offset 3 with the fixed transform
        cur.execute(sql.SQL("INSERT INTO {} (id, source_topic, source_partition, source_offset) "
                            "VALUES (3, %s, 0, 3)").format(sql.Identifier(orders.sink_table)), [orders.topic])
    result = dead_letters.replay(orders, [letter.pk], actor="otto")
    assert result.counts == {"already_in_sink": 1}
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == [0, 1, 2, 3, 4]
    assert not DeadLetter.objects.exists()
    assert DeadLetterReplay.objects.get().rows_written == 0


def test_a_multi_row_dead_letter_becomes_its_numbered_rows(pipeline):
    parts = pipeline("parts", transform="csv_ints")
    consume(parts, {0: {0: "1,2", 1: "3,x4,5", 2: "6"}})
    fix_transform(parts, "tests.replay_transforms.lenient_csv")
    dead_letters.replay(parts, [DeadLetter.objects.get().pk], actor="otto")
    assert rows_in_provenance_order(parts) == [(0, 0, 0, 1), (0, 0, 1, 2), (0, 1, 0, 3), (0, 1, 1, 4), (0, 1, 2, 5),
                                               (0, 2, 0, 6)]
    assert verify(parts, 0, 3).proven


def test_dead_letters_at_or_beyond_the_position_are_left_to_the_pipeline(pipeline):
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    # A rewind moved the position back to 5: offsets 7 and 8 will be read again by the pipeline.
    orders.offsets.filter(partition=0).update(next_offset=5)
    result = dead_letters.replay(orders, list(DeadLetter.objects.values_list("pk", flat=True)), actor="otto")
    assert result.counts == {"replayed": 1, "not_yet_consumed": 2}
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == [7, 8]


def test_a_replay_of_an_at_least_once_pipeline_writes_one_row_without_a_unique_key(pipeline):
    classic = pipeline("classic", mode=DeliveryMode.AT_LEAST_ONCE)
    consume(classic, {0: values(5)})
    fix_transform(classic)
    letter = DeadLetter.objects.get()
    dead_letters.replay(classic, [letter.pk], actor="otto")
    dead_letters.replay(classic, [letter.pk], actor="otto")
    assert [o for _, o, _, _ in rows_in_provenance_order(classic)] == [0, 1, 2, 3, 4]


def test_bad_replay_input_is_refused_audited_and_changes_nothing(pipeline):
    orders = pipeline()
    consume(orders, {0: values(5)})
    fix_transform(orders)
    for ids, source, expected in [([], "stored", "No dead letters selected"),
                                  (["a"], "stored", "must be integers"),
                                  (list(range(1001)), "stored", "At most 1000"),
                                  ([1], "tape", "Unknown source")]:
        with pytest.raises(Refused, match=expected):
            dead_letters.replay(orders, ids, actor="otto", source=source)
    with pytest.raises(Refused, match="No pipeline named"):
        dead_letters.replay("nope", [1], actor="otto")
    assert DeadLetter.objects.count() == 1
    refusals = ActionLog.objects.filter(action="replay_dead_letters", result=ActionResult.REFUSED, actor="otto")
    assert refusals.count() == 5


def test_a_replay_that_fails_in_the_database_changes_nothing_and_is_audited_as_failed(pipeline):
    orders = pipeline()
    consume(orders, {0: values(5)})
    # The new transform writes a column the sink table does not have.
    fix_transform(orders, "tests.replay_transforms.lenient_event")
    with pytest.raises(Exception, match="kind"):
        dead_letters.replay(orders, [DeadLetter.objects.get().pk], actor="otto")
    assert DeadLetter.objects.count() == 1 and not DeadLetterReplay.objects.exists()
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == [0, 1, 2, 4]
    entry = ActionLog.objects.get(action="replay_dead_letters")
    assert entry.result == ActionResult.FAILED and "kind" in entry.message


def test_a_dead_letter_the_database_still_refuses_stays_one_with_its_reason_and_the_others_are_replayed(pipeline):
    """A record that passes the fixed transform but that PostgreSQL refuses (here a CHECK) failed the whole replay
    (FAILED, a 409 on the API, and "replay all matching" stopped at its batch); step 4 says it stays a dead letter
    with the new error, as the commit protocol dead-letters such a record while writing the rest."""
    orders = pipeline()
    consume(orders, {0: values(10, bad={3: "x3", 7: "70?", 8: "junk"})})
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT below_fifty CHECK (id < 50)").format(
            sql.Identifier(orders.sink_table)))
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    result = dead_letters.replay(orders, ids, actor="otto")

    assert result.counts == {"replayed": 1, "still_bad": 2}
    assert [(o.offset, o.result) for o in result.outcomes] == [(3, "replayed"), (7, "still_bad"), (8, "still_bad")]
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == [0, 1, 2, 3, 4, 5, 6, 9]
    refused = DeadLetter.objects.get(offset=7)
    assert refused.replay_attempts == 1 and refused.error.startswith("database refused: 23514 ")
    assert "below_fifty" in refused.error
    assert list(DeadLetterReplay.objects.values_list("offset", flat=True)) == [3]
    assert ActionLog.objects.get(action="replay_dead_letters").result == ActionResult.DONE
    checked = verify(orders, 0, 10)
    assert (checked.lost, checked.duplicated, checked.dead_lettered) == (0, 0, 2)


def test_discard_needs_a_reason_and_a_discarded_dead_letter_is_never_replayed(pipeline):
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    letter = DeadLetter.objects.get(offset=3)
    with pytest.raises(Refused, match="needs a reason"):
        dead_letters.discard(orders, [letter.pk], "  ", actor="otto")
    assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()

    result = dead_letters.discard(orders, [letter.pk], "test data from the load test", actor="otto")
    assert result.counts == {"discarded": 1}
    letter.refresh_from_db()
    assert (letter.discarded_by, letter.discard_reason) == ("otto", "test data from the load test")
    replayed = dead_letters.replay(orders, [letter.pk], actor="otto")
    assert replayed.counts == {"discarded": 1}
    assert 3 not in [o for _, o, _, _ in rows_in_provenance_order(orders)]
    actions_logged = list(ActionLog.objects.filter(action="discard_dead_letters").values_list("result", flat=True))
    assert sorted(actions_logged) == [ActionResult.DONE, ActionResult.REFUSED]


@pytest.mark.kafka
def test_a_replay_from_kafka_rereads_the_records_at_the_dead_letters_offsets(transactional_db, kafka_bootstrap,
                                                                            make_topic):
    from consumers.engine.python import run_pipeline
    from tests.views_helpers import drop_sink, produce

    topic = make_topic("replay")
    produce(kafka_bootstrap, topic, ["1", "2", "x3", "4", "5?", "6"])
    orders = create_pipeline("replay-orders", topic, "sink_replay_orders", "int_value", batch_size=10)
    try:
        run_pipeline(orders.name, stop_when_caught_up=True, max_seconds=60)
        assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == [2, 4]
        # The stored copies are damaged on purpose: a Kafka replay must not use them.
        DeadLetter.objects.update(value=b"junk")
        fix_transform(orders)

        result = dead_letters.replay(orders, list(DeadLetter.objects.values_list("pk", flat=True)), actor="otto",
                                     source="kafka")

        assert result.counts == {"replayed": 2}
        assert [(o, i) for _, o, _, i in rows_in_provenance_order(orders)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5),
                                                                               (5, 6)]
        assert set(DeadLetterReplay.objects.values_list("source", flat=True)) == {"kafka"}
    finally:
        drop_sink(orders.sink_table)


JSON_ORDERS_DDL = ("CREATE TABLE sink_json_replay (id bigint NOT NULL, qty smallint, ordered_at timestamptz, "
                   "origin text, source_topic text NOT NULL, source_partition integer NOT NULL, "
                   "source_offset bigint NOT NULL, UNIQUE (source_topic, source_partition, source_offset))")


def test_a_stored_replay_of_a_json_pipeline_mapping_timestamp_or_headers_is_refused(pipeline):
    # The stored copy keeps only the key and the value: replayed from it, @timestamp and @header columns were NULL.
    with connection.cursor() as cur:
        cur.execute(JSON_ORDERS_DDL)
    try:
        orders = Pipeline.objects.create(name="json-replay", topic="json-replay", sink_table="sink_json_replay",
                                         transform="json", epoch=1,
                                         json_map={"ordered_at": "@timestamp", "origin": "@header:origin"})
        conn = db.connect("tally-tests")
        try:
            commit.ensure_positions(conn, orders.pk, {0: 0})
            commit.commit_batch(conn, commit.Target.for_pipeline(orders), 1, {0: [
                SourceRecord(0, 0, b"k", b'{"id": 1, "qty": 99999}', 1_714_559_400_000, [("origin", b"web")])]})
        finally:
            conn.close()
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE sink_json_replay ALTER COLUMN qty TYPE integer")

        with pytest.raises(Refused, match="@header:origin, @timestamp.*replay from Kafka"):
            dead_letters.replay(orders, list(DeadLetter.objects.values_list("pk", flat=True)), source="stored")
        assert DeadLetter.objects.count() == 1 and not rows_in_provenance_order(orders)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS sink_json_replay")


@pytest.mark.kafka
def test_a_replay_from_kafka_gives_a_json_mapping_the_records_timestamp_and_headers(transactional_db,
                                                                                    kafka_bootstrap, make_topic):
    topic = make_topic("json-replay")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(topic, value=b'{"id": 1, "qty": 99999}', partition=0, timestamp_ms=1_714_559_400_000,
                  headers=[("origin", b"web")])
    producer.flush(timeout=10)
    producer.close(timeout=10)
    with connection.cursor() as cur:
        cur.execute(JSON_ORDERS_DDL)
    try:
        orders = Pipeline.objects.create(name="json-replay", topic=topic, sink_table="sink_json_replay",
                                         transform="json", epoch=1,
                                         json_map={"ordered_at": "@timestamp", "origin": "@header:origin"})
        run_pipeline(orders.name, stop_when_caught_up=True, max_seconds=60)
        assert DeadLetter.objects.filter(pipeline=orders).count() == 1
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE sink_json_replay ALTER COLUMN qty TYPE integer")

        result = dead_letters.replay(orders, list(DeadLetter.objects.values_list("pk", flat=True)), source="kafka")

        assert result.counts == {"replayed": 1}
        with connection.cursor() as cur:
            cur.execute("SELECT qty, ordered_at, origin FROM sink_json_replay")
            qty, ordered_at, origin = cur.fetchone()
        assert (qty, ordered_at.isoformat(), origin) == (99999, "2024-05-01T10:30:00+00:00", "web")
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS sink_json_replay")
