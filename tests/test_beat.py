"""The process's beat (consumers/engine/beat.py): one heartbeat for every run of a process, whatever their number,
and what it tells each run (fenced, peers); and the engine's connection pool (consumers/engine/db.py)."""
import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from consumers.engine import db, shares
from consumers.engine.beat import Beat, Member
from consumers.models import ConsumerRun, Engine, Pipeline
from tests.chaos import wait_for
from tests.conftest import leftover_connections


def pipeline_with_runs(name: str, runs: int, epoch: int = 1) -> tuple[Pipeline, list[ConsumerRun]]:
    pipeline = Pipeline.objects.create(name=name, topic=name, sink_table=f"{name}_sink", epoch=epoch)
    return pipeline, [ConsumerRun.objects.create(pipeline=pipeline, epoch=epoch, engine=Engine.PYTHON, pid=1)
                      for _ in range(runs)]


def beat_of(runs: list[ConsumerRun]) -> Beat:
    """A beat holding `runs`, driven from the test's thread (its own thread is never started)."""
    beat = Beat()
    for run in runs:
        beat.members[run.pk] = Member(run.pk, run.pipeline_id, run.epoch)
    return beat


@pytest.mark.django_db
@pytest.mark.parametrize("count", [2, 20])
def test_a_beat_costs_the_same_four_queries_for_two_idle_runs_or_twenty(count):
    _, runs = pipeline_with_runs("many", count)
    beat = beat_of(runs)
    beat._beat_once()     # the first beat takes each run's session lock and writes each run's progress once
    with CaptureQueriesContext(connection) as queries:
        beat._beat_once()
    # heartbeats (one UPDATE), epochs, the live runs, the open sessions
    assert len(queries) == 4, [q["sql"][:80] for q in queries]
    assert ConsumerRun.objects.filter(heartbeat_at__isnull=False).count() == count


@pytest.mark.django_db
def test_a_busy_run_adds_its_progress_and_the_beat_tells_each_run_its_peers():
    a, (a1, a2) = pipeline_with_runs("a", 2)
    b, (b1,) = pipeline_with_runs("b", 1)
    beat = beat_of([a1, a2, b1])
    beat.members[a1.pk].partitions, beat.members[a1.pk].records = [1, 0], 12
    ConsumerRun.objects.filter(pk=a1.pk).update(claimed_partitions=[0, 1])   # as shares.claim wrote them
    beat._beat_once()
    a1.refresh_from_db()
    assert (a1.assigned_partitions, a1.records_processed) == ([0, 1], 12)
    assert beat.members[a2.pk].peers == {a1.pk: {0, 1}, a2.pk: set()}   # peers are told the claims
    assert beat.members[b1.pk].peers == {b1.pk: set()}
    assert not any(member.fenced for member in beat.members.values())


@pytest.mark.django_db
def test_the_beat_fences_the_runs_of_a_pipeline_that_moved_on_or_was_deleted_and_only_those():
    a, (a1,) = pipeline_with_runs("a", 1)
    b, (b1,) = pipeline_with_runs("b", 1)
    c, (c1,) = pipeline_with_runs("c", 1)
    beat = beat_of([a1, b1, c1])
    a.bump_epoch()
    Pipeline.objects.filter(pk=b.pk).delete()
    beat._beat_once()
    assert beat.members[a1.pk].fenced == "the pipeline moved to epoch 2 (this run joined epoch 1)"
    assert beat.members[b1.pk].fenced == "the pipeline was deleted"
    assert beat.members[c1.pk].fenced == ""


@pytest.mark.django_db
def test_only_a_consuming_run_is_judged_stuck_not_one_still_starting(settings):
    """A Spark run's session may take minutes to start on a busy machine: a run still starting is not stuck; one
    that consumes and has not turned for the stall limit is, and leaves the beat declared crashed."""
    settings.TALLY_RUN_STALL_SECONDS = 60
    _, (starting, consuming) = pipeline_with_runs("stall", 2)
    beat = beat_of([starting, consuming])
    beat.members[consuming.pk].consuming = True
    for member in beat.members.values():
        member.turned_at -= 61
    beat._awake_since -= 61
    beat._beat_once()
    assert list(beat.members) == [starting.pk]
    starting.refresh_from_db(), consuming.refresh_from_db()
    assert starting.state != "crashed" and consuming.state == "crashed", (starting.state, consuming.state)
    assert "no progress for 60 s" in consuming.end_reason


@pytest.mark.django_db
def test_a_run_that_left_stops_counting_as_a_member_and_its_row_is_left_alone():
    pipeline, (one, two) = pipeline_with_runs("left", 2)
    beat = beat_of([one, two])
    beat._beat_once()
    assert set(shares.members(pipeline.pk, 1, timezone.now())) == {one.pk, two.pk}
    beat.leave(beat.members[one.pk])
    ConsumerRun.objects.filter(pk=one.pk).update(records_processed=99)
    beat._beat_once()    # releases the session lock of the run that left, and writes only the other
    assert set(shares.members(pipeline.pk, 1, timezone.now())) == {two.pk}
    assert ConsumerRun.objects.get(pk=one.pk).records_processed == 99


@pytest.mark.django_db(transaction=True)
def test_runs_forcing_a_heartbeat_together_share_beats_and_the_idle_beat_lets_its_connection_go():
    _, runs = pipeline_with_runs("forced", 8)
    beat = Beat()
    members = [beat.join(run.pk, run.pipeline_id, run.epoch) for run in runs]   # join forces a beat each
    threads = [threading.Thread(target=beat.now) for _ in range(8)]
    with beat._cycle_lock:   # no beat can run until all eight ask: they are then at once, whatever the machine's speed
        for thread in threads:
            thread.start()
        wait_for(lambda: beat.waiting >= 8, 30, "eight forced heartbeats to wait")
        started = beat._started
    for thread in threads:
        thread.join(timeout=30)
    assert beat._started - started <= 2   # eight forced heartbeats at once: one or two beats, not eight
    for member in members:
        beat.leave(member)
    assert beat.wait_idle(timeout=30)
    # The beat's connection is a Django one; engine connections (the pool's, "tally-engine") are other tests' runs'.
    assert leftover_connections(keep=lambda row: row[0] != "tally-engine") == []


@pytest.mark.django_db(transaction=True)
def test_the_engine_pool_lends_at_most_its_size_and_takes_back_a_connection_without_a_transaction():
    pool = db.ConnectionPool(2, application_name="tally-tests")
    try:
        with pool.connection() as first, pool.connection() as second:
            assert first is not second
            lent_third = threading.Event()

            def third():
                with pool.connection():
                    lent_third.set()

            waiter = threading.Thread(target=third)
            waiter.start()
            assert not lent_third.wait(0.5)   # both lent: the third borrower waits
            with first.cursor() as cur:
                cur.execute("SELECT 1")       # leaves a transaction open
        waiter.join(timeout=10)
        assert lent_third.is_set()
        with pool.connection() as again:
            assert again.status == 1 and again in (first, second)   # STATUS_READY: the transaction rolled back
    finally:
        pool.close()


@pytest.mark.django_db(transaction=True)
def test_a_connection_lent_while_its_pool_is_replaced_or_closed_is_closed_when_it_comes_back(settings):
    # A changed setting replaces the pool (tests), a session's end closes it: neither may leave a lent connection
    # open when its borrower gives it back.
    with db.engine_connection() as lent:
        settings.TALLY_ENGINE_DB_CONNECTIONS += 1
        with db.engine_connection() as other:    # the new pool's
            assert other is not lent
        assert not lent.closed
    assert lent.closed
    with db.engine_connection() as borrowed:
        db.close_pool()
    assert borrowed.closed and other.closed
    with db.engine_connection() as fresh:        # the next borrower gets a new pool
        with fresh.cursor() as cursor:
            cursor.execute("SELECT 1")
    db.close_pool()


def test_at_most_the_pools_size_of_threads_hold_a_turn_at_a_django_connection_at_once(settings):
    size = settings.TALLY_ENGINE_DB_CONNECTIONS
    inside, most, lock, release = [0], [0], threading.Lock(), threading.Event()

    def run():
        db.take_turn()
        db.take_turn()          # a thread holding a turn takes no second one
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(10)
        with lock:
            inside[0] -= 1
        db.end_turn()

    threads = [threading.Thread(target=run) for _ in range(size + 3)]
    for thread in threads:
        thread.start()
    wait_for(lambda: inside[0] == size, 10, "the turns to be taken")
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert most[0] == size and inside[0] == 0 and not db.holds_turn()


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_first_heartbeat_times_out_is_ended_not_left_a_member_heartbeated_for_ever(monkeypatch):
    """The join's forced heartbeat timed out (a row lock, a stalled database) and the member stayed in the beat:
    not consuming, so never judged stuck, its row heartbeated for as long as the process lived, and the supervisor
    counted a live run that no one ran."""
    from consumers.engine import beat as beat_module
    from consumers.engine import lifecycle
    from consumers.models import RunState
    from consumers.operations import supervisor

    monkeypatch.setattr(beat_module, "FORCED_WAIT_S", 0.5)
    beat = Beat()
    monkeypatch.setattr(lifecycle.beat, "beat", lambda: beat)
    other = Pipeline.objects.create(name="other", topic="o", sink_table="o_sink", epoch=1)
    victim = Pipeline.objects.create(name="victim", topic="v", sink_table="v_sink", epoch=1)
    first = lifecycle.Run(other, Engine.PYTHON)
    locker = db.connect("tests-locker")
    locker.cursor().execute("SELECT id FROM consumers_consumerrun WHERE id = %s FOR UPDATE", [first.row.pk])

    def release_once_the_join_gave_up():   # the beat waits on the lock until then, whatever the machine's speed
        wait_for(lambda: beat.waiting >= 1, 30, "the new run's join to wait for a heartbeat")
        wait_for(lambda: beat.waiting == 0, 30, "the join to give up")
        locker.rollback()

    releaser = threading.Thread(target=release_once_the_join_gave_up)
    releaser.start()
    with pytest.raises(TimeoutError):
        lifecycle.Run(victim, Engine.PYTHON)
    releaser.join(timeout=60)
    locker.close()

    row = ConsumerRun.objects.get(pipeline=victim)
    assert row.pk not in beat.members
    assert row.state == RunState.CRASHED and "could not begin: TimeoutError" in row.end_reason
    assert supervisor.live_runs(victim) == []
    first.finish("stopped")
    assert beat.wait_idle(timeout=30)
