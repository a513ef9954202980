"""One heartbeat for every run in this process: a thread that, about once a second, writes all their
heartbeats in one statement (plus one progress update per run whose count or partitions moved), and reads their
pipelines' epochs in one query and their peers in two (consumers/engine/shares.py `members_of`).

Why: a run used to heartbeat, check its epoch and read its peers on its own (four small queries a second on a
Django connection of its own, next to its engine connection). An engine host holds hundreds of runs
(consumers/engine/hosts.py): that was most of an idle run's CPU and two PostgreSQL connections per pipeline.
Now the process's beat does it for all of them on one connection, and a run reads the outcome from memory.

The beat's connection is also every run's *session* (consumers/engine/shares.py rule 1): it holds one advisory
lock per run, so PostgreSQL releases them the moment the process dies and peers stop counting its runs at once.

A run stuck (its poll loop has not turned for TALLY_RUN_STALL_SECONDS: a transform call that never returns) is no
longer heartbeated: the beat declares it crashed, saying why, and drops it (its session lock too), so the supervisor
restarts its pipeline at a new epoch; the stuck thread, should it ever return, is fenced by that epoch.

A run (consumers/engine/lifecycle.py `Run`) joins the beat when it starts and leaves it when it ends. Its
`heartbeat()` hands the beat its progress and raises if the last beat found it fenced; a forced heartbeat waits
for a beat that started after it was asked (runs that force at once share one). The beat never raises into a
run; a beat that failed is reported to each run at its next heartbeat, as its own query's failure was.
"""
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.utils import timezone

from consumers.engine import shares
from consumers.engine.per_process import PerProcess
from consumers.models import ConsumerRun, Pipeline

log = logging.getLogger("tally.engine")

INTERVAL_S = 1.0          # the epoch contract: a run notices a newer epoch within about a second
FORCED_WAIT_S = 30.0      # a forced heartbeat that no beat answers in this long: the database is not answering
# A beat that comes this long after the last one: the process itself was stopped or starved (SIGSTOP, swapped out).
# Its runs did not turn either; they get a whole stall limit from now before they count as stuck.
FROZEN_GAP_S = 5.0


@dataclass(eq=False)
class Member:
    """One run's place in the beat. The run writes `records`, `partitions` and `turned_at`; the beat the rest."""
    run_id: int
    pipeline_id: int
    epoch: int
    records: int = 0
    partitions: list[int] | None = None          # None: leave the row's as it is
    turned_at: float = field(default_factory=time.monotonic)   # the run's last heartbeat: its poll loop turns
    # Only a run that consumes is judged stuck: starting (a Spark session's JVM on a busy machine) may take minutes.
    consuming: bool = False
    fenced: str = ""                              # why the run must end: a newer epoch, a deleted pipeline
    stalled: str = ""                             # why the beat gave it up: no progress for the stall limit
    peers: dict[int, set[int]] = field(default_factory=dict)   # shares.members of its pipeline's epoch
    failure: str = ""                             # the last beat's error, until a beat succeeds
    _written: tuple | None = None                 # the progress the row holds


class Beat:
    """The beat of one process (`beat()`): its thread starts with the first run that joins."""

    def __init__(self):
        self.members: dict[int, Member] = {}
        self._locked: set[int] = set()            # run ids whose advisory lock the beat's session holds
        self._lock = threading.Lock()
        self._cycle_lock = threading.Lock()       # held for a whole beat: leave() waits out the one running
        self._cond = threading.Condition(self._lock)
        self._started = self._finished = 0        # beats started and finished: a forced heartbeat waits on them
        self._wanted = 0
        self.waiting = 0                          # forced heartbeats waiting for their beat now
        self._thread: threading.Thread | None = None
        self._awake_since = time.monotonic()      # since the last frozen gap: no run counts as stuck before it

    # --- a run's side ----------------------------------------------------------------------------------
    def join(self, run_id: int, pipeline_id: int, epoch: int) -> Member:
        member = Member(run_id, pipeline_id, epoch)
        with self._lock:
            self.members[run_id] = member
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="tally-beat", daemon=True)
                self._thread.start()
        try:
            self.now()   # the run is a member (its session lock taken) before it reads a partition
        except BaseException:
            # Not a member that no one ends: it is not consuming, so the stuck-run check would never drop it, and
            # the beat would keep its row alive for as long as the process lives (a run no one restarts).
            self.leave(member)
            raise
        return member

    def leave(self, member: Member) -> None:
        """The run ends: after this returns no beat writes its row (its end must not be overwritten); its
        session lock goes at the next beat."""
        with self._cycle_lock, self._cond:
            self.members.pop(member.run_id, None)
            self._wanted = max(self._wanted, self._started + 1)   # release its session lock soon
            self._cond.notify_all()

    def now(self) -> None:
        """Wait for a beat that starts after this call (it carries every member's latest progress)."""
        with self._cond:
            target = self._started + 1
            self._wanted = max(self._wanted, target)
            self._cond.notify_all()
            self.waiting += 1
            try:
                answered = self._cond.wait_for(lambda: self._finished >= target, timeout=FORCED_WAIT_S)
            finally:
                self.waiting -= 1
            if not answered:
                raise TimeoutError(f"no heartbeat reached the database in {FORCED_WAIT_S:.0f} s")

    # --- the beat's thread -----------------------------------------------------------------------------
    def _serve(self) -> None:
        next_beat = last_beat = time.monotonic()
        while True:
            with self._cond:
                self._cond.wait_for(lambda due=next_beat: self._wanted > self._started or time.monotonic() >= due,
                                    timeout=max(0.0, next_beat - time.monotonic()))
                self._started += 1
            if time.monotonic() - last_beat > FROZEN_GAP_S:
                self._awake_since = time.monotonic()
            last_beat = time.monotonic()
            with self._cycle_lock:
                self._beat_once()
            next_beat = time.monotonic() + INTERVAL_S
            with self._cond:
                self._finished = self._started
                self._cond.notify_all()

    def _beat_once(self) -> None:
        with self._lock:
            stalled = self._drop_stalled()
            members = list(self.members.values())
            gone = self._locked - set(self.members)
        try:
            self._declare_stalled(stalled)
            self._hold_sessions(members, gone)
            if members:
                self._write_and_read(members)
            failure = ""
        except Exception as exc:   # the runs hear of it at their next heartbeat; the next beat starts afresh
            log.warning("heartbeat of %d run(s) failed: %s", len(members), exc)
            failure = f"{type(exc).__name__}: {exc}"
            self._locked.clear()
            connection.close()     # a new session takes every lock again
        for member in members:
            member.failure = failure
        if not members and not self._locked:
            connection.close()     # a process without runs holds no connection

    def wait_idle(self, timeout: float) -> bool:
        """Wait until the beat holds no run and no connection (a test session's end, before its database goes)."""
        with self._cond:
            if self._thread is None:
                return True
            target = self._wanted = max(self._wanted, self._started + 1)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self.members and not self._locked and self._finished >= target,
                                       timeout=timeout)

    def _drop_stalled(self) -> list[Member]:
        """The members whose run has not turned for the stall limit, taken out of the beat (under the lock): no
        heartbeat keeps their lease, and their session lock goes in this beat, so peers stop counting them."""
        limit = settings.TALLY_RUN_STALL_SECONDS
        if not limit:
            return []
        since = time.monotonic() - limit
        stalled = [m for m in self.members.values() if m.consuming and max(m.turned_at, self._awake_since) < since]
        for member in stalled:
            member.stalled = (f"no progress for {limit} s (stuck, say in a transform call that never returns): engine "
                              f"pid {os.getpid()} stopped heartbeating it so that the pipeline is restarted "
                              f"(TALLY_RUN_STALL_SECONDS)")
            del self.members[member.run_id]
        return stalled

    def _declare_stalled(self, stalled: list[Member]) -> None:
        """Say why on the run rows, so the supervisor restarts at once, the reason on the page (if this fails, the
        lease lapses all the same)."""
        for member in stalled:
            log.error("run %d %s", member.run_id, member.stalled)
            ConsumerRun.objects.filter(pk=member.run_id).declare_crashed(member.stalled, timezone.now())

    def _hold_sessions(self, members: list[Member], gone: set[int]) -> None:
        if not gone and all(member.run_id in self._locked for member in members):
            return
        with connection.cursor() as cursor:
            for run_id in gone:
                shares.unlock_session(cursor, run_id)
                self._locked.discard(run_id)
            for member in members:
                if member.run_id not in self._locked:
                    shares.lock_session(cursor, member.run_id)
                    self._locked.add(member.run_id)

    def _write_and_read(self, members: list[Member]) -> None:
        now = timezone.now()
        ConsumerRun.objects.filter(pk__in=[m.run_id for m in members]).heartbeat(now)
        changed = [m for m in members if _progress(m) != m._written]
        for member in changed:   # busy runs only: an idle run's progress does not move
            progress = {"records_processed": member.records}
            if member.partitions is not None:
                progress["assigned_partitions"] = sorted(member.partitions)
            ConsumerRun.objects.filter(pk=member.run_id).heartbeat(now, **progress)
            member._written = _progress(member)
        epochs = dict(Pipeline.objects.filter(pk__in={m.pipeline_id for m in members}).values_list("pk", "epoch"))
        peers = shares.members_of({(m.pipeline_id, m.epoch) for m in members}, now)
        for member in members:
            epoch = epochs.get(member.pipeline_id)
            if epoch is None:
                member.fenced = "the pipeline was deleted"
            elif epoch != member.epoch:
                member.fenced = f"the pipeline moved to epoch {epoch} (this run joined epoch {member.epoch})"
            member.peers = peers.get((member.pipeline_id, member.epoch), {})


def _progress(member: Member) -> tuple:
    return member.records, None if member.partitions is None else tuple(sorted(member.partitions))


_beat = PerProcess(Beat)
beat = _beat.get            # this process's beat
existing = _beat.existing   # it, if this process has one
