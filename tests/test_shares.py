"""Which partitions each exactly-once run reads (consumers/engine/shares.py): every other partition by run id,
handed over only once the other run let go, with members judged by lease and by an open database session."""
from datetime import timedelta

import pytest
from django.utils import timezone

from consumers.engine import db as engine_db
from consumers.engine import shares
from consumers.models import ConsumerRun, Pipeline
from tests.waiting import wait_for


def test_runs_in_id_order_take_every_nth_partition():
    assert shares.share([0, 1, 2, 3, 4], [7, 3], 3) == {0, 2, 4}
    assert shares.share([0, 1, 2, 3, 4], [7, 3], 7) == {1, 3}
    assert shares.share([5, 1, 3], [], 9) == {1, 3, 5}           # alone: everything
    assert shares.share([0, 1], [1, 2, 3], 3) == set()          # more runs than partitions


def test_a_run_counts_itself_even_when_the_database_no_longer_does():
    # A run frozen past its lease is not among the members it reads; it still is one.
    assert shares.share([0, 1, 2, 3], [4], 9) == {1, 3}


def test_a_run_takes_its_share_only_once_the_other_member_let_go_and_gives_up_the_rest_at_once():
    partitions = [0, 1, 2, 3]
    # A new run (id 2) beside a run (id 1) that still holds everything: it waits.
    assert shares.to_hold(partitions, {1: {0, 1, 2, 3}, 2: set()}, 2, set()) == set()
    # The old run gives up what is no longer its share.
    assert shares.to_hold(partitions, {1: {0, 1, 2, 3}, 2: set()}, 1, {0, 1, 2, 3}) == {0, 2}
    # Once it reports that, the new run takes the rest.
    assert shares.to_hold(partitions, {1: {0, 2}, 2: set()}, 2, set()) == {1, 3}
    # The other member is gone: the survivor takes everything, also what the gone one last reported.
    assert shares.to_hold(partitions, {2: {1, 3}}, 2, {1, 3}) == {0, 1, 2, 3}


@pytest.fixture
def pipeline(db):
    return Pipeline.objects.create(name="shared", topic="t", sink_table="s", epoch=3)


def run(pipeline, epoch=3, heartbeat_age=timedelta(0), partitions=()):
    now = timezone.now()
    return ConsumerRun.objects.create(pipeline=pipeline, epoch=epoch, host="h", pid=1, state="running",
                                      started_at=now - heartbeat_age, heartbeat_at=now - heartbeat_age,
                                      assigned_partitions=list(partitions), claimed_partitions=list(partitions))


def test_a_run_is_a_member_while_its_session_is_open_and_stops_being_one_when_it_closes(pipeline):
    holding = run(pipeline, partitions=[0, 2])
    run(pipeline, partitions=[1])   # a SIGKILLed run: its heartbeat is still recent, its session is gone
    conn = engine_db.connect("tally-tests")
    try:
        shares.hold_session(conn, holding.pk)
        assert shares.members(pipeline.pk, 3, timezone.now()) == {holding.pk: {0, 2}}
    finally:
        conn.close()
    # The server ends the session (and frees the lock) just after the client hangs up.
    wait_for(lambda: shares.members(pipeline.pk, 3, timezone.now()) == {}, 10, "the session to end")


def test_runs_of_another_epoch_past_their_lease_or_ended_are_not_members(pipeline, settings):
    settings.TALLY_RUN_LEASE_SECONDS = 15
    current = run(pipeline)
    older_epoch = run(pipeline, epoch=2)
    frozen = run(pipeline, heartbeat_age=timedelta(seconds=16))
    ended = run(pipeline)
    ConsumerRun.objects.filter(pk=ended.pk).end("stopped", "stopped", timezone.now())
    connections = []
    try:
        for member in (current, older_epoch, frozen, ended):
            connections.append(engine_db.connect("tally-tests"))
            shares.hold_session(connections[-1], member.pk)
        assert set(shares.members(pipeline.pk, 3, timezone.now())) == {current.pk}
    finally:
        for conn in connections:
            conn.close()


@pytest.fixture
def committed_pipeline(transactional_db):
    """Rows the engine's own connections can see (shares.claim reads on one)."""
    return Pipeline.objects.create(name="claimed", topic="t", sink_table="s", epoch=3)


def claim(pipeline, member, held=(), partitions=(0,), epoch=3):
    with engine_db.engine_connection() as conn:
        return shares.claim(conn, pipeline.pk, epoch, member.pk, list(partitions), set(held), timezone.now())


def test_a_run_whose_share_another_run_holds_claims_it_only_once_that_run_let_go(committed_pipeline):
    # One partition. The later run started first and, alone then, took it; the earlier run (whose share by rule 2
    # it is) joins on a reading taken before that holding was written. Its claim reads afresh and waits.
    first, second = run(committed_pipeline), run(committed_pipeline)
    sessions = [engine_db.connect("tally-tests") for _ in range(2)]
    try:
        shares.hold_session(sessions[1], second.pk)
        assert claim(committed_pipeline, second) == {0}
        assert ConsumerRun.objects.get(pk=second.pk).claimed_partitions == [0]
        shares.hold_session(sessions[0], first.pk)
        assert shares.to_hold([0], {first.pk: set(), second.pk: set()}, first.pk, set()) == {0}   # stale: take
        assert claim(committed_pipeline, first) == set()                                         # fresh: wait
        # The holder gives it up (it is the earlier run's share), and only then does the other take it.
        assert claim(committed_pipeline, second, held={0}) == set()
        assert claim(committed_pipeline, first) == {0}
        assert ConsumerRun.objects.get(pk=first.pk).claimed_partitions == [0]
        assert ConsumerRun.objects.get(pk=second.pk).claimed_partitions == []
    finally:
        for conn in sessions:
            conn.close()


def test_a_dead_holder_does_not_stop_a_claim_and_a_run_of_an_older_epoch_claims_nothing(committed_pipeline):
    dead_holder = run(committed_pipeline, partitions=[0])   # its session is gone: SIGKILLed
    member = run(committed_pipeline)
    conn = engine_db.connect("tally-tests")
    try:
        shares.hold_session(conn, member.pk)
        assert claim(committed_pipeline, member) == {0}
        Pipeline.objects.filter(pk=committed_pipeline.pk).update(epoch=4)
        with pytest.raises(shares.NotInEpoch, match="epoch 4"):
            claim(committed_pipeline, member, held={0})
        assert ConsumerRun.objects.get(pk=member.pk).claimed_partitions == [0]   # unchanged
    finally:
        conn.close()
    assert ConsumerRun.objects.get(pk=dead_holder.pk).claimed_partitions == [0]
