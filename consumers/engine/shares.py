"""Which partitions each Python-engine run of a pipeline reads, in every delivery mode: decided in the database, not
by a Kafka group.

Why not the consumer group: every join waits (the embedded broker about half the session timeout, real
Kafka its initial rebalance delay for an empty group), and a killed member keeps its partitions until its
session expires. Exactly-once does not need the group to be correct: positions come from the database,
the epoch fences older runs, and the commit protocol skips records below the stored position, so two runs
that read one partition for a while still write each record once. Runs therefore `assign()` partitions.

The rule, applied by every run before a poll, at most once a second (`BALANCE_INTERVAL_S`), on the members
the process's beat last read (`members_of`, two queries for all the runs of a process):
  1. Members: the runs of the pipeline's current epoch that are alive (heartbeat within the lease,
     `ConsumerRun.objects.alive`) and whose process's session with PostgreSQL is open. The process's beat
     (consumers/engine/beat.py) holds one session advisory lock per run (`hold_session`) on its connection;
     PostgreSQL releases it the moment the process dies, so a killed run stops counting at once, a frozen one
     when its lease ends.
  2. Share: members in run-id order; the i-th of n reads the topic's i-th, (i+n)-th, ... partitions.
  3. A run gives up the partitions outside its share at once, and takes one of its share only when no other
     member has claimed it (`ConsumerRun.claimed_partitions`): a partition moves between live runs within about
     two balance intervals, never read by both.

Rule 3 is decided on the beat's last reading, then made sure of by `claim`: under a per-pipeline lock, the run
reads its peers' claims afresh and writes its own before it reads a partition (and after it gave one up). Two
runs deciding at once on readings taken before either held anything would otherwise both take a partition;
exactly-once would still write each record once, but the classic modes resume from Kafka's committed offset,
and both would write it.
"""
from datetime import datetime

from django.db import connection
from psycopg2 import sql
from psycopg2.extras import Json

from consumers.engine.tables import table
from consumers.models import ConsumerRun, Pipeline

BALANCE_INTERVAL_S = 1.0  # as often as the heartbeat: a new or dead peer is seen within about a second
# The advisory lock's first key: the namespace of Tally runs (the second key is the run id).
RUN_LOCK_NAMESPACE = 0x7A11
CLAIM_LOCK_NAMESPACE = 0x7A12   # a transaction lock per pipeline (second key): its runs claim one at a time
_INT4 = 1 << 31


def _lock_key(run_id: int) -> int:
    return run_id % _INT4


def hold_session(conn, run_id: int) -> None:
    """Mark `conn` (a psycopg2 connection) as run `run_id`'s session for as long as it stays open."""
    with conn.cursor() as cursor:
        lock_session(cursor, run_id)
    conn.commit()


def lock_session(cursor, run_id: int) -> None:
    """`hold_session` on a cursor's connection; the lock is the session's, whatever its transaction does."""
    cursor.execute("SELECT pg_advisory_lock(%s, %s)", [RUN_LOCK_NAMESPACE, _lock_key(run_id)])


def unlock_session(cursor, run_id: int) -> None:
    """The run ended: the cursor's connection is no longer its session."""
    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [RUN_LOCK_NAMESPACE, _lock_key(run_id)])


def members(pipeline_id: int, epoch: int, now: datetime) -> dict[int, set[int]]:
    """{run id: partitions it has claimed} for the members of the pipeline's epoch (rule 1)."""
    return members_of({(pipeline_id, epoch)}, now).get((pipeline_id, epoch), {})


def members_of(epochs: set[tuple[int, int]], now: datetime) -> dict[tuple[int, int], dict[int, set[int]]]:
    """`members` of several (pipeline id, epoch) pairs in two queries: {(pipeline id, epoch): {run id: held}}."""
    runs = (ConsumerRun.objects.filter(pipeline_id__in={pipeline for pipeline, _ in epochs}).alive(now)
            .values_list("pk", "pipeline_id", "epoch", "claimed_partitions"))
    runs = [run for run in runs if (run[1], run[2]) in epochs]
    if not runs:
        return {}
    with connection.cursor() as cursor:
        open_sessions = _open_sessions(cursor)
    found: dict[tuple[int, int], dict[int, set[int]]] = {}
    for run, pipeline, epoch, held in runs:
        if _lock_key(run) in open_sessions:
            found.setdefault((pipeline, epoch), {})[run] = set(held or ())
    return found


def _open_sessions(cursor) -> set[int]:
    """The lock keys of the runs whose session is open (rule 1), on any cursor (Django's or psycopg2's)."""
    cursor.execute("SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted "
                   "AND classid = %s AND objsubid = 2 "
                   "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                   [RUN_LOCK_NAMESPACE])
    return {row[0] for row in cursor.fetchall()}


class NotInEpoch(Exception):
    """The pipeline moved to another epoch (or was deleted): the run claims nothing and must end."""


def claim(conn, pipeline_id: int, epoch: int, me: int, partitions: list[int], held: set[int],
          now: datetime) -> set[int]:
    """Rule 3 on a fresh reading, atomically: what run `me` (holding `held`) holds from now on, written as its
    `claimed_partitions` before it returns. `conn` is a psycopg2 connection with no transaction open; it is
    committed. Raises NotInEpoch when the pipeline is no longer at `epoch`."""
    runs = ConsumerRun.objects.filter(pipeline_id=pipeline_id, epoch=epoch).alive(now).values_list(
        "pk", "claimed_partitions")
    runs_query, runs_params = runs.query.sql_with_params()   # the one definition of alive, as SQL
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [CLAIM_LOCK_NAMESPACE, _lock_key(pipeline_id)])
            cursor.execute(sql.SQL("SELECT epoch FROM {} WHERE id = %s").format(table(Pipeline)), [pipeline_id])
            row = cursor.fetchone()
            if row is None or row[0] != epoch:
                raise NotInEpoch("the pipeline was deleted" if row is None else
                                 f"the pipeline moved to epoch {row[0]} (this run joined epoch {epoch})")
            cursor.execute(runs_query, runs_params)
            alive = cursor.fetchall()
            sessions = _open_sessions(cursor)
            peers = {run: set(held_by or ()) for run, held_by in alive if _lock_key(run) in sessions}
            hold = to_hold(partitions, peers, me, held)
            cursor.execute(sql.SQL("UPDATE {} SET claimed_partitions = %s WHERE id = %s").format(
                table(ConsumerRun)), [Json(sorted(hold)), me])
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return hold


def share(partitions: list[int], member_ids: list[int], me: int) -> set[int]:
    """Rule 2: the partitions member `me` should read."""
    ordered = sorted(set(member_ids) | {me})
    index, count = ordered.index(me), len(ordered)
    return {p for i, p in enumerate(sorted(partitions)) if i % count == index}


def to_hold(partitions: list[int], peers: dict[int, set[int]], me: int, held: set[int]) -> set[int]:
    """Rule 3: what run `me`, holding `held`, should hold now, given the other members and what they hold."""
    others = {run: parts for run, parts in peers.items() if run != me}
    wanted = share(partitions, list(others), me)
    taken = set().union(*others.values()) if others else set()
    return (held & wanted) | (wanted - taken)
