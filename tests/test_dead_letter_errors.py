"""A transform's error that PostgreSQL could not store as it is (its message quotes the record: a NUL, a lone
surrogate; or its str() fails) still makes a dead letter with that reason, escaped, and the pipeline goes on; and a
replay into a sink with a deferred key refuses the one record, not the call."""
import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine import commit, db
from consumers.engine.transforms import SourceRecord
from consumers.models import DeadLetter, DeadLetterReplay, PartitionOffset
from consumers.operations import dead_letters
from tests.test_dead_letters import consume, fix_transform, pipeline, values  # noqa: F401 (pipeline: fixture)


def commit_values(made, raw_values):
    conn = db.connect("tally-tests")
    try:
        commit.ensure_positions(conn, made.pk, {0: 0})
        records = [SourceRecord(0, offset, None, value) for offset, value in enumerate(raw_values)]
        return commit.commit_batch(conn, commit.Target.for_pipeline(made), made.epoch, {0: records})[0]
    finally:
        conn.close()


@pytest.mark.parametrize("bad, stored", [(b"x\x00y", "not a number: x\\x00y"),
                                         (b"\xed\xa0\x80", "not a number: \\ud800")])
def test_an_error_quoting_a_nul_or_a_lone_surrogate_is_stored_escaped_and_the_batch_commits(pipeline, bad, stored):  # noqa: F811
    made = pipeline("quoting", "tests.replay_transforms.quoting_int")
    outcome = commit_values(made, [b"1", bad, b"3"])
    assert (outcome.end_offset, outcome.rows_written, outcome.dead_letters) == (3, 2, 1)
    letter = DeadLetter.objects.get(pipeline=made)
    assert (letter.offset, letter.error) == (1, f"BadRecord: {stored}")
    assert PartitionOffset.objects.get(pipeline=made, partition=0).next_offset == 3

    result = dead_letters.replay(made, [letter.pk], actor="otto")   # still bad: its reason stored again
    assert result.counts == {"still_bad": 1}
    letter.refresh_from_db()
    assert (letter.error, letter.replay_attempts) == (f"BadRecord: {stored}", 1)


def test_an_error_whose_message_cannot_be_read_is_named_by_its_type(pipeline):  # noqa: F811
    made = pipeline("unreadable", "tests.replay_transforms.unreadable_error_int")
    outcome = commit_values(made, [b"1", b"boom"])
    assert (outcome.end_offset, outcome.dead_letters) == (2, 1)
    assert DeadLetter.objects.get(pipeline=made).error == "UnreadableError: (its message could not be read)"


def test_a_replay_into_a_sink_with_a_deferred_unique_key_refuses_only_that_record(pipeline):  # noqa: F811
    orders = pipeline()
    with connection.cursor() as cur:
        cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT id_once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED")
                    .format(sql.Identifier(orders.sink_table)))
    # Once fixed, offset 3 "x3" is id 3, which offset 2 wrote already; offset 7 "99?" is id 99, new.
    consume(orders, {0: values(10, bad={3: "x3", 7: "99?"})})
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    result = dead_letters.replay(orders, ids, actor="otto")

    assert result.counts == {"replayed": 1, "still_bad": 1}
    assert list(DeadLetterReplay.objects.values_list("offset", flat=True)) == [7]
    assert "id_once" in DeadLetter.objects.get(offset=3).error
