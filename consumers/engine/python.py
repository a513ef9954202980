"""The Python engine: runs one pipeline in this process, in its delivery mode, reading through either Kafka
client (consumers/engine/consumer.py `EngineConsumer`: kafka-python by default, or librdkafka).

Exactly-once, per poll, in this order:
  1. poll up to `batch_size` records (fault point `after-poll`);
  2. the writer thread calls `commit.commit_batch`: sink rows, dead letters, ledger row and next_offset
     in one PostgreSQL transaction (fault points `mid-write`, `after-write`), then `after-db-commit`;
  3. meanwhile this thread polls and decodes the next batch (the overlap is the engine's speed-up);
  4. once the write is done, the same offsets go to Kafka (advisory: a failure is logged, never fatal).
Positions come from the database. Partitions too, in every mode: a run joins no Kafka consumer group (no
join to wait for, no dead member's session to wait out); it assign()s the partitions that
consumers/engine/shares.py gives it (several runs of a pipeline split them there) and seeks each to its stored
next_offset (created from the reset policy when missing) before reading it. A batch refused as a gap
(commit.Gap) is dropped and the partitions are sought back to the database.

Positions, never offset arithmetic (docs/architecture.md "Positions"): after each poll the engine takes
the consumer's position per partition; the batch is `commit.Fetch(position before, position after)`, so
a batch that crossed transaction markers, aborted or compacted records stores the position past them,
and a poll that crossed only a hole still moves the stored position.

At-least-once: the same steps, but positions come from Kafka's committed offset (the group's, read when a
run takes a partition; the group is only the offsets' store), so a crash after the DB commit and before the
Kafka commit writes the batch again. At-most-once: Kafka commit first (fault point `after-kafka-commit`),
then the write, so a crash in between loses the batch. Both are the classic consumers of the blog post the
demo reproduces; what they lose or duplicate comes from the order of the two commits, not from the group.

The run's life cycle -- its ConsumerRun row, heartbeat and fencing, counts, outcome and Kafka's copy of
the positions -- is consumers/engine/lifecycle.py, shared with the Spark engine.
"""
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from django.conf import settings
from django.utils import timezone

from consumers.engine import caught_up, commit, db, log_bounds, parking, shares
from consumers.engine.consumer import PositionOutOfRange, client_for, fetches_of_poll, make_consumer
from consumers.engine.lifecycle import (
    HEARTBEAT_INTERVAL_S,
    KafkaPositions,
    Run,
    RunEnded,
    RunResult,
    cluster_unusable,
    target_of,
)
from consumers.engine.options import PEERS_WAIT_S, RunOptions, run_engine, why_stopped, with_keywords
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.kafka.errors import KafkaUnreachable
from consumers.models import DeliveryMode, Engine, Pipeline

log = logging.getLogger("tally.engine")

POLL_TIMEOUT_MS = 200        # short, so the loop checks the stop flag, heartbeat and deadline often
# After an empty poll: one poll per heartbeat interval. A record that arrives still returns at once (the fetch
# answers as soon as it has data); an idle run then costs a fifth of the wake-ups (hundreds idle in one worker).
IDLE_POLL_TIMEOUT_MS = 1000
MAX_CONSECUTIVE_GAPS = 5     # a gap that re-seeking does not cure (e.g. records deleted by retention)
CAUGHT_UP_CHECK_S = 1.0      # "caught up" reads every partition's log end: at most once a second


def run(name: str, options: RunOptions) -> RunResult:
    """PipelineEngine, with its Kafka client (kafka-python or librdkafka) in this thread. `options.peers`: this run
    is one of that many started together (`run_pipeline --processes`); it takes partitions once they are all members
    (at most PEERS_WAIT_S), so each takes its share at once instead of all of them first and handing most over a
    second later."""
    return run_engine(_Engine, Engine.PYTHON, name, options)


run_pipeline = with_keywords(run)


class _Engine:
    def __init__(self, pipeline: Pipeline, options: RunOptions):
        self.pipeline = pipeline
        self.peers = options.peers
        self.peers_deadline = time.monotonic() + PEERS_WAIT_S if self.peers > 1 else None
        self.target = target_of(pipeline)
        self.epoch = pipeline.epoch
        self.mode = pipeline.delivery_mode
        self.positions_from_db = pipeline.is_exactly_once
        self.stop = options.stop or threading.Event()
        self.batch_size = options.batch_size or pipeline.batch_size
        self.delay_s = options.delay_ms / 1000
        self.options = options   # its limits, faults and task, read where they apply
        self.in_flight: Future | None = None
        self.fetched: dict[int, int] = {}  # partition -> the position the next poll's records come from
        self.next_caught_up_check = 0.0
        self.gaps = 0
        self.out_of_range = 0   # consecutive polls Kafka refused as out of range (_out_of_range)
        self.next_balance = 0.0
        self.poll_timeout_ms = POLL_TIMEOUT_MS
        self.idle_since: float | None = None   # when the run last found nothing to read (parking.py)
        self.park_after = settings.TALLY_PARK_IDLE_SECONDS

    # --- life cycle --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.lifecycle = Run(self.pipeline, Engine.PYTHON, task_id=self.options.task_id)
        log.info("%s: run %s joins epoch %s (%s, batch %s)", self.pipeline.name, self.lifecycle.row.pk,
                 self.epoch, self.mode, self.batch_size)
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="tally-writer")
        self.consumer = self.kafka = None
        reason, detail = "error", ""
        try:
            # A cluster that cannot be used ends the run within seconds, its reason naming the cluster and
            # the cause (TLS, authentication, unreachable), instead of a consumer retrying for minutes.
            self.cluster = clusters.preflight(self.pipeline.cluster)
            self.consumer = self._new_consumer()
            self.kafka = KafkaPositions(self.pipeline, self.consumer)
            # From here this thread needs no Django connection of its own (the beat and the engine pool serve
            # it): an idle run in a host holds none, and gives its turn to the next run starting.
            db.end_turn()
            reason = self._loop()
        except RunEnded as ended:
            reason, detail = ended.reason, ended.detail
        except KafkaUnreachable as exc:
            reason, detail = cluster_unusable(self.pipeline, exc)
        except Exception as exc:
            log.exception("%s: run %s failed", self.pipeline.name, self.lifecycle.row.pk)
            reason, detail = "error", f"{type(exc).__name__}: {exc}"
        finally:
            self._shutdown(reason)
        if reason == "stopped":
            detail = why_stopped(self.stop, detail)
        db.take_turn()   # runs ending together (a shutdown) write their ends a few at a time
        try:
            return self.lifecycle.finish(reason, detail)
        finally:
            db.end_turn()

    def _new_consumer(self):
        # Exactly-once: the database says where every partition reads, so the client may never move a position on
        # its own ("none"): a log start past it is for log_bounds to stop at or skip, audited (_out_of_range).
        reset_policy = "none" if self.positions_from_db else self.pipeline.reset_policy
        return make_consumer(self.pipeline.group_id, topic=self.target.topic, client_id=f"tally-{self.pipeline.name}",
                             reset_policy=reset_policy, isolation_level=self.pipeline.isolation_level,
                             max_poll_records=self.batch_size, cluster=self.cluster, client=client_for(self.pipeline))

    def _loop(self) -> str:
        deadline = time.monotonic() + self.options.max_seconds if self.options.max_seconds else None
        while True:
            if self.stop.is_set():
                self._drain()
                return "stopped"
            if deadline is not None and time.monotonic() >= deadline:
                self._drain()
                return "max_seconds"
            self._heartbeat()
            if not self._balance():
                # Holding no partition (more runs than partitions): done when the whole topic is.
                if self.options.stop_when_caught_up and self._caught_up():
                    return "caught_up"
                continue
            try:
                batches = self.consumer.poll(timeout_ms=self.poll_timeout_ms, max_records=self.batch_size)
            except PositionOutOfRange as exc:
                self._out_of_range(exc)
                continue
            fetches = fetches_of_poll(self.consumer, batches, self.fetched)
            if fetches:
                self.out_of_range = 0
            busy = batches or fetches or self.options.stop_when_caught_up
            self.poll_timeout_ms = POLL_TIMEOUT_MS if busy else IDLE_POLL_TIMEOUT_MS
            self.idle_since = None if batches or fetches else self.idle_since or time.monotonic()
            if not batches and fetches:
                # Only holes were crossed (markers, aborted records): the stored position moves past them.
                self._write_behind(batches, fetches)
                continue
            if not batches:
                # Idle: finish the batch in flight now, so its offsets reach Kafka without waiting for the
                # next record (a run in a worker may idle for hours).
                moved_back = self._drain()
                if self.options.stop_when_caught_up and not moved_back and self._caught_up():
                    return "caught_up"
                if not moved_back and self._idle_long_enough():
                    self._park(deadline)   # returns woken, with a consumer again, or stopped (the loop ends)
                continue
            self.options.faults.maybe_crash("after-poll")
            if self.in_flight is not None:
                self.options.faults.maybe_crash("after-next-poll")
            self.lifecycle.records_arrived()
            if self.mode == DeliveryMode.AT_MOST_ONCE:
                self._at_most_once(batches, fetches)
            else:
                self._write_behind(batches, fetches)

    def _shutdown(self, reason: str) -> None:
        future, self.in_flight = self.in_flight, None
        if future is not None:
            # Never close the connection under a write; its outcome no longer matters to this run.
            try:
                future.result()
            except Exception as exc:
                log.info("%s: batch in flight at shutdown was not committed: %s", self.pipeline.name, exc)
        self.writer.shutdown(wait=True)
        if self.consumer is not None:
            if self.kafka is not None:
                self.kafka.finish(reason)
            try:
                self.consumer.close()
            except Exception as exc:
                log.warning("%s: closing the Kafka consumer failed: %s", self.pipeline.name, exc)

    # --- batches -----------------------------------------------------------------------------------
    def _write_behind(self, batches, fetches) -> None:
        """Exactly-once and at-least-once (and at-most-once crossing a hole): write this batch while the
        next one is polled."""
        self._simulate_processing(batches)
        if self._drain():
            return  # the previous batch was a gap: positions moved back, this batch is a gap too
        self.in_flight = self.writer.submit(self._write, batches, fetches)

    def _at_most_once(self, batches, fetches) -> None:
        """The classic loss: Kafka commit first (the consumer's positions), then the write."""
        # Kafka takes this commit from any run (none is a group member): a run fenced by a restart or a
        # rewind must find out before it moves the group's offsets, not at its next write.
        self._heartbeat(force=True)
        self.kafka.before_write({p: fetch.end for p, fetch in fetches.items()})
        self.options.faults.maybe_crash("after-kafka-commit")
        self._simulate_processing(batches)
        self.in_flight = self.writer.submit(self._write, batches, fetches)
        self._drain()

    def _write(self, batches, fetches):
        """Writer thread: the one DB transaction of a batch (consumers/engine/commit.py)."""
        with db.engine_connection() as conn:
            outcomes = commit.commit_batch(conn, self.target, self.epoch, batches, self.options.faults, fetches)
        self.options.faults.maybe_crash("after-db-commit")
        return outcomes

    def _drain(self) -> bool:
        """Wait for the batch in flight and commit its offsets to Kafka. Returns True when it was refused
        as a gap and the partitions were sought back to the database (drop whatever was polled since)."""
        future, self.in_flight = self.in_flight, None
        if future is None:
            return False
        try:
            outcomes = future.result()
        except commit.Gap as exc:
            self.gaps += 1
            if self.gaps > MAX_CONSECUTIVE_GAPS:
                raise RunEnded("error", f"gap not cured by seeking to the database: {exc}") from None
            log.warning("%s: %s; seeking back to the database's positions", self.pipeline.name, exc)
            self._seek_to_database(self.consumer.assignment())
            return True
        except commit.CommitRefused as exc:
            raise RunEnded.refused(exc.reason, str(exc)) from None
        self.gaps = 0
        self.kafka.after_db_commit(self.lifecycle.count(outcomes))
        return False

    def _out_of_range(self, exc: PositionOutOfRange) -> None:
        """The log no longer holds a position (exactly-once only: the classic modes keep their client's reset policy,
        as such consumers do). The batch in flight commits first; then the partitions are sought to the database's
        positions again, which log_bounds checks against the log as it is now: its policy stops the run, or skips
        what retention deleted with a ledger note. A position Kafka still refuses after that ends the run."""
        self.out_of_range += 1
        if not self.positions_from_db or self.out_of_range > MAX_CONSECUTIVE_GAPS:
            raise RunEnded("error", str(exc))
        log.warning("%s: %s; seeking to the database's positions", self.pipeline.name, exc)
        if not self._drain():
            self._seek_to_database(self.consumer.assignment())

    def _simulate_processing(self, batches) -> None:
        if not self.delay_s:
            return
        for records in batches.values():
            for _ in records:
                self._sleep(self.delay_s)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            # A stop abandons the batch (not yet written); at-most-once has already committed it to
            # Kafka, so it finishes the batch rather than lose it on a graceful stop.
            if self.stop.is_set() and self.mode != DeliveryMode.AT_MOST_ONCE:
                raise RunEnded("stopped", "stopped while processing a batch; it was not written")
            self._heartbeat()
            time.sleep(min(left, 0.1))

    # --- positions ---------------------------------------------------------------------------------
    def _balance(self) -> bool:
        """Hold the partitions consumers/engine/shares.py gives this run (checked at most every
        BALANCE_INTERVAL_S); newly held ones are sought to their positions (the database's, or in the classic
        modes Kafka's committed offsets) before any poll.
        Returns False when this run holds none (it waits a poll's time instead of polling)."""
        now = time.monotonic()
        if now >= self.next_balance:
            members = self.lifecycle.peers()
            if self._waiting_for_peers(members, now):
                self.stop.wait(POLL_TIMEOUT_MS / 1000)
                return False
            self.next_balance = now + shares.BALANCE_INTERVAL_S
            self._hold(shares.to_hold(self.consumer.partitions(), members, self.lifecycle.row.pk,
                                      self.consumer.assignment()))
        if self.consumer.assignment():
            return True
        self.stop.wait(POLL_TIMEOUT_MS / 1000)
        return False

    def _waiting_for_peers(self, members: dict, now: float) -> bool:
        if self.peers_deadline is None:
            return False
        if len(members) >= self.peers or now >= self.peers_deadline:
            self.peers_deadline = None
            return False
        self._heartbeat(force=True)  # be seen by the peers as early as they look
        return True

    def _hold(self, partitions: set[int]) -> None:
        """Hold `partitions` (rule 3 on the beat's last reading), as `shares.claim` confirms them on a fresh one."""
        held = self.consumer.assignment()
        if partitions == held:
            return
        self._drain()   # the batch in flight belongs to the old assignment: settle it first
        with db.engine_connection() as conn:
            try:
                partitions = shares.claim(conn, self.pipeline.pk, self.epoch, self.lifecycle.row.pk,
                                          self.consumer.partitions(), held, timezone.now())
            except shares.NotInEpoch as exc:
                raise RunEnded("fenced", str(exc)) from None
        if partitions == held:
            return
        self.kafka.forget(held - partitions)   # its next holder commits it to Kafka from now on
        new = sorted(partitions - held)
        self.consumer.assign(partitions)
        if self.positions_from_db:
            self._seek_to_database(new)
        else:
            self._resume_from_kafka(new)
        log.info("%s: run %s holds %s (gave up %s)", self.pipeline.name, self.lifecycle.row.pk,
                 {p: self.consumer.position(p) for p in new} or "nothing new",
                 sorted(held - partitions) or "nothing")
        self._heartbeat(force=True)  # the row shows what it reads, positioned, at once

    def _resume_from_kafka(self, partitions) -> None:
        """The classic modes: a partition this run takes resumes from the group's committed offset, which is
        also where the ledger goes on (it may sit on a marker, so the first record's offset would leave a hole
        outside the ledger). Without one, the consumer's reset policy decides, and the ledger starts at the
        first record read -- except for a partition added to the topic since the pipeline started (it has read
        others, never this one): its records were all produced since, so it is read from its start."""
        stored = None
        for p in partitions:
            self.fetched.pop(p, None)
            try:
                committed = self.consumer.committed(p)
            except Exception as exc:
                # Both clients look the committed offset up again before their first fetch; only the ledger's
                # start is then the first record read.
                log.info("%s: committed offset of partition %s unknown: %s", self.pipeline.name, p, exc)
                continue
            if committed is not None:
                self.consumer.seek(p, committed)
                self.fetched[p] = committed
                continue
            if stored is None:
                with db.engine_connection() as conn:
                    stored = commit.stored_positions(conn, self.pipeline.pk)
            if stored and p not in stored:
                self.consumer.seek_to_beginning(p)

    def _seek_to_database(self, partitions) -> None:
        held = self.consumer.assignment()
        partitions = sorted(p for p in partitions if p in held)
        if not partitions:
            return
        with db.engine_connection() as conn:
            stored = commit.stored_positions(conn, self.pipeline.pk)
        marks = kafka_admin.watermarks(self.target.topic, None if not stored else partitions,
                                      cluster=self.pipeline.cluster)
        with db.engine_connection() as conn:   # not held across the Kafka call: other runs may need it
            if not stored:
                # The pipeline's first start: every partition of the topic gets its position from the reset
                # policy now, so a partition without one later was added to the topic since.
                stored = commit.ensure_positions(conn, self.pipeline.pk,
                                                 {p: self.pipeline.initial_position(m) for p, m in marks.items()})
            missing = [p for p in partitions if p not in stored]
            if missing:
                # Added while the pipeline ran: its records were produced since, so it is read from its start.
                stored = commit.ensure_positions(conn, self.pipeline.pk, {p: marks[p].log_start for p in missing})
            wanted = {p: stored[p] for p in partitions}
            try:
                for skip in log_bounds.check(conn, self.pipeline, self.target, self.epoch, wanted, marks):
                    log.warning("%s: %s (the pipeline's policy is to skip)", self.pipeline.name, skip.note)
            except log_bounds.LogBoundsError as exc:
                raise RunEnded("error", str(exc)) from None
            except commit.Fenced as exc:
                raise RunEnded("fenced", str(exc)) from None
        stored.update(wanted)
        for p in partitions:
            self.consumer.seek(p, stored[p])
            self.fetched[p] = stored[p]

    def _caught_up(self) -> bool:
        """Every partition of the topic -- also those other (or dead) members hold -- has its stored
        position at the log end (consumers/engine/caught_up.py), whatever this run holds, even nothing. Checked
        at most once a second, and only with nothing in flight (an open transaction keeps a read_committed
        consumer below the high watermark: the log end that counts is the last stable offset)."""
        if self.in_flight is not None:
            return False
        now = time.monotonic()
        if now < self.next_caught_up_check:
            return False
        self.next_caught_up_check = now + CAUGHT_UP_CHECK_S
        return caught_up.topic_caught_up(self.pipeline).done

    # --- parking (consumers/engine/parking.py) ------------------------------------------------------
    def _idle_long_enough(self) -> bool:
        # A run asked to stop when caught up ends instead; one in flight or holding nothing has no reason to.
        return (self.park_after > 0 and not self.options.stop_when_caught_up and self.in_flight is None
                and self.idle_since is not None and time.monotonic() - self.idle_since >= self.park_after
                and bool(self.consumer.assignment()))

    def _park(self, deadline: float | None) -> None:
        """Close the consumer and wait, holding the partitions, until records arrive past the positions, the
        topic grows, the peers change, the run is stopped or fenced (raises), or its time is up. Then read on
        from the stored positions (exactly-once) or from where it stood (the classic modes)."""
        held = self.consumer.assignment()
        positions = {p: self.consumer.position(p) for p in held}
        if self.positions_from_db and None in positions.values():   # nothing read there yet: the stored one
            with db.engine_connection() as conn:
                stored = commit.stored_positions(conn, self.pipeline.pk)
            positions = {p: positions[p] if positions[p] is not None else stored.get(p) for p in held}
        if any(offset is None for offset in positions.values()):
            return   # a position not known yet (nothing read, nothing stored): stay a reader
        partitions = self.consumer.partitions() or set(held)
        self.kafka.settle()   # Kafka's copy of the positions is complete before its consumer goes
        self.consumer.close()
        self.consumer = None
        self.kafka.use(None)
        lot = parking.lot()
        parked = lot.park(parking.Parked(self.pipeline.cluster, self.target.topic, self.pipeline.isolation_level,
                                         positions, set(partitions)))
        log.info("%s: run %s parks at %s", self.pipeline.name, self.lifecycle.row.pk, positions)
        try:
            while not parked.woken.wait(HEARTBEAT_INTERVAL_S):
                self.lifecycle.heartbeat(held)   # fenced: raises RunEnded, and the run ends from here
                if self.stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                    return   # the loop ends the run; there is nothing in flight
                if shares.to_hold(sorted(partitions), self.lifecycle.peers(), self.lifecycle.row.pk, held) != held:
                    parked.wake("its peers changed")
        finally:
            lot.leave(parked)
        log.info("%s: run %s wakes: %s", self.pipeline.name, self.lifecycle.row.pk, parked.reason)
        self.consumer = self._new_consumer()
        self.kafka.use(self.consumer)
        self.consumer.assign(held)
        if self.positions_from_db:
            self._seek_to_database(held)
        else:
            for partition, offset in positions.items():
                self.consumer.seek(partition, offset)
                self.fetched[partition] = offset
        self.idle_since, self.next_balance = None, 0.0
        self.poll_timeout_ms = POLL_TIMEOUT_MS

    # --- heartbeat and fencing (consumers/engine/lifecycle.py) ----------------------------------------
    def _heartbeat(self, force: bool = False) -> None:
        self.lifecycle.heartbeat(self.consumer.assignment() if self.consumer else (), force=force)
