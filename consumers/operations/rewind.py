"""Rewinds of Tally pipelines: a plan (the dry run) and its execution, one audited operator action.

The real run, in this order (docs/architecture.md "Rewinds"):
  1. claim the pipeline (an ActionLog row `running`; refused while another action runs);
  2. plan and validate (refusals here leave everything as it was);
  3. pause and fence: desired state `paused`, epoch bumped; wait until the runs have ended;
  4. plan again from the settled positions, then in ONE PostgreSQL transaction: move `next_offset`,
     set `replay_until` (sink kept: how far it was written) or delete the sink rows at or beyond the new offset
     (roll back sink), mark ledger rows `superseded_from`, move `PartitionHealth.verified_offset` back,
     commit Kafka's group offsets (advisory for exactly-once; required for the classic modes, which
     resume from Kafka, so a failure there rolls everything back), and finish the action log entry;
  5. resume the pipeline if it was running (a new epoch, a run enqueued).
"""
import logging
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg2 import sql

from consumers import waiting
from consumers.engine import sinks
from consumers.engine.sink_checks import table_exists
from consumers.engine.tables import table
from consumers.kafka import admin as kafka_admin
from consumers.models import (
    ActionLog,
    ActionResult,
    BatchLedger,
    ConsumerRun,
    DesiredState,
    LedgerSummary,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
)
from consumers.operations import actions
from consumers.operations.errors import KAFKA_ERRORS, Refused, as_refusal
from consumers.operations.offset_specs import (
    OffsetSpec,
    PartitionMove,
    choose_partitions,
    offsets_of,
    parse_spec,
    resolve_offsets,
)

log = logging.getLogger("tally.rewind")

ACTION = "rewind"
# Rolling back an append sink deletes the rows written from the new offset on, which leaves the table as it was
# at that offset. An upsert table keeps one row per key, overwritten in place and deleted by tombstones: the
# values a key held before are gone, so no delete can bring the table back to an earlier offset. A rewind that
# keeps the sink is what works there (replayed records are written in place again, in order).
UPSERT_ROLLBACK_REFUSED = (
    "roll back sink is refused for an upsert pipeline: its table holds one row per key, updated in place and "
    "deleted by tombstones, so the rows it held at an earlier offset no longer exist and deleting rows cannot "
    "bring them back. Rewind without roll back sink: the records from the new offset are applied again, in order, "
    "and each key's row ends at its latest record. To rebuild the table from the start, empty it and rewind to "
    "the earliest offset.")


class RewindNotCommitted(RuntimeError):
    """The rewind's transaction failed after Kafka's committed offsets moved; the message says what became of them."""


@dataclass
class RewindResult:
    pipeline: str
    spec: OffsetSpec
    moves: list[PartitionMove]
    dry_run: bool
    rollback_sink: bool
    action_log: ActionLog
    rows_deleted: dict[int, int] = field(default_factory=dict)
    resumed: bool = False
    message: str = ""
    rows_to_delete: dict[int, int] = field(default_factory=dict)   # a dry run with roll back sink

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "mode": self.spec.mode, "value": self.spec.raw or None,
                "dry_run": self.dry_run, "rollback_sink": self.rollback_sink, "resumed": self.resumed,
                "action_id": self.action_log.pk, "result": self.action_log.result, "message": self.message,
                "partitions": [{**m.as_dict(), "rows_deleted": self.rows_deleted.get(m.partition, 0),
                                "rows_to_delete": self.rows_to_delete.get(m.partition, 0)} for m in self.moves],
                "rows_to_delete": sum(self.rows_to_delete.values()),
                "reprocess": sum(m.reprocess for m in self.moves), "skip": sum(m.skip for m in self.moves)}


def rewind(name, mode: str, value=None, *, partitions: list[int] | None = None, rollback_sink: bool = False,
           dry_run: bool = False, actor: str = "cli") -> RewindResult:
    """Rewind (or move forward) the pipeline `name`. Raises Refused (nothing changed, the refusal is in
    the action log) on bad input or while another action runs on the pipeline, and its Unavailable when Kafka
    cannot be used or refuses a request (also when it went down after the cluster's check passed)."""
    params = {"mode": mode, "value": None if value is None else str(value), "partitions": partitions or "all",
              "rollback_sink": rollback_sink}
    pipeline = actions.lookup(name, ACTION, actor, params)
    if problem := actions.cluster_problem(pipeline):   # not Kafka being down (a 503): waiting would not help
        actions.refuse(pipeline, ACTION, actor, params, f"Cannot rewind pipeline {pipeline.name!r}: {problem}. "
                                                        "Nothing was changed.", dry_run=dry_run)
    if rollback_sink and pipeline.is_upsert:
        actions.refuse(pipeline, ACTION, actor, params, UPSERT_ROLLBACK_REFUSED, dry_run=dry_run)
    if rollback_sink and not _sink_exists(pipeline):
        actions.refuse(pipeline, ACTION, actor, params,
                       f"roll back sink is refused: the sink table {pipeline.sink_table!r} does not exist (dropped or "
                       f"renamed?), so there are no rows to delete. Nothing was changed.", dry_run=dry_run)
    try:
        spec = parse_spec(mode, value)
    except Refused as exc:
        actions.refuse(pipeline, ACTION, actor, params, str(exc), dry_run=dry_run)
    if dry_run:
        return _dry_run(pipeline, spec, partitions, rollback_sink, actor, params)
    entry = actions.claim(pipeline, ACTION, actor, params)
    try:
        return _execute(pipeline, spec, partitions, rollback_sink, entry)
    except (Refused, *KAFKA_ERRORS) as exc:  # _execute put the pipeline's state back: nothing was moved
        refusal = as_refusal(exc)
        actions.refuse(pipeline, ACTION, actor, params, str(refusal), entry=entry, kind=type(refusal))
    except Exception as exc:
        ActionLog.objects.filter(pk=entry.pk).update(result=ActionResult.FAILED, finished_at=timezone.now(),
                                                     message=f"{type(exc).__name__}: {exc}")
        raise


def _sink_exists(pipeline: Pipeline) -> bool:
    with connection.cursor() as cursor:
        return table_exists(cursor.cursor, pipeline.sink_table)


def plan(pipeline: Pipeline, spec: OffsetSpec, partitions: list[int] | None = None) -> list[PartitionMove]:
    """Per partition: the current position, the new one, and how many records are re-read or skipped."""
    chosen = choose_partitions(pipeline.topic, partitions, cluster=pipeline.cluster)
    marks = kafka_admin.watermarks(pipeline.topic, chosen, cluster=pipeline.cluster)
    current, delivered = current_positions(pipeline, chosen, marks)
    return resolve_offsets(spec, pipeline.topic, chosen, current, marks, cluster=pipeline.cluster,
                           delivered=delivered)


def current_positions(pipeline: Pipeline, partitions: list[int], marks) -> tuple[dict[int, int], dict[int, int]]:
    """Where each partition resumes: the DB's next_offset for exactly-once; Kafka's committed offset for
    the classic modes (they resume from it). A partition never consumed starts by the reset policy.
    And, where it is further, how far the sink was written (the DB's next_offset): an at-least-once run that
    crashed between its DB commit and its Kafka commit wrote past where it resumes, so a rewind gives back
    (or skips) records counted from there, and roll back sink deletes their rows."""
    rows = PartitionOffset.objects.filter(pipeline=pipeline, partition__in=partitions).values_list(
        "partition", "next_offset", "replay_until")
    resume = {p: n for p, n, _ in rows}
    # The classic modes write a replay again: after a rewind that kept the sink, it was written up to replay_until
    # (until the pipeline passes it), not only up to the moved-back position.
    stored = {p: n if pipeline.is_exactly_once else max(n, until or n) for p, n, until in rows}
    if not pipeline.is_exactly_once:
        committed = kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, partitions,
                                                  cluster=pipeline.cluster)
        resume.update({p: o for p, o in committed.items() if o is not None})
    resume = {p: resume[p] if p in resume else pipeline.initial_position(marks[p]) for p in partitions}
    written = {p: stored[p] for p in partitions if p in stored and stored[p] > resume[p]}
    return resume, written


def _dry_run(pipeline, spec, partitions, rollback_sink, actor, params) -> RewindResult:
    try:
        moves = plan(pipeline, spec, partitions)
    except (Refused, *KAFKA_ERRORS) as exc:
        refusal = as_refusal(exc)
        actions.refuse(pipeline, ACTION, actor, params, str(refusal), dry_run=True, kind=type(refusal))
    to_delete = {}
    if rollback_sink:
        with connection.cursor() as cursor:
            to_delete = {m.partition: sinks.count_rows_from(cursor, pipeline.sink_table, pipeline.topic, m.partition,
                                                            m.new) for m in moves}
    message = f"dry run: {_summary(spec, moves, rollback_sink, to_delete if rollback_sink else None, planned=True)}" \
              f"; nothing was changed"
    entry = ActionLog.objects.create(
        pipeline=pipeline, action=ACTION, actor=actor,
        params={**params, "plan": [m.as_dict() for m in moves], **({"rows_to_delete": to_delete} if to_delete else {})},
        dry_run=True, offsets_before=offsets_of(moves, "current"), offsets_after=offsets_of(moves, "new"),
        result=ActionResult.DONE, message=message, finished_at=timezone.now())
    return RewindResult(pipeline.name, spec, moves, True, rollback_sink, entry, message=message,
                        rows_to_delete=to_delete)


def _execute(pipeline, spec, partitions, rollback_sink, entry) -> RewindResult:
    plan(pipeline, spec, partitions)  # refuse bad input before the pipeline is touched
    pipeline.refresh_from_db()
    was_running = pipeline.desired_state == DesiredState.RUNNING
    previous_state = pipeline.desired_state
    with transaction.atomic():
        Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        epoch = actions.set_state(pipeline, DesiredState.PAUSED)
    moved = resumed = False
    try:
        _wait_for_runs_to_end(pipeline, epoch)
        moves = plan(pipeline, spec, partitions)   # positions may have moved until the pause
        deleted = _apply(pipeline, spec, moves, rollback_sink, entry)
        moved = True
    finally:
        # Resume if it was running; after a refusal or failure, put the state back as it was. Unless another
        # action came since the pause (it may, once this rewind's entry is done): the newer action stands.
        if was_running or not moved:
            with transaction.atomic():
                if Pipeline.objects.select_for_update().get(pk=pipeline.pk).epoch == epoch:
                    actions.set_state(pipeline, previous_state,
                                      enqueue_runs=pipeline.parallel_runs if was_running else 0)
                    resumed = was_running
        elif previous_state != DesiredState.PAUSED:
            # A stopped pipeline stays stopped (paused only while it was rewound), so it can still be changed or
            # deleted; no run of it is left to fence, so no new epoch.
            Pipeline.objects.filter(pk=pipeline.pk, desired_state=DesiredState.PAUSED).update(
                desired_state=previous_state, updated_at=timezone.now())
    entry.refresh_from_db()
    return RewindResult(pipeline.name, spec, moves, False, rollback_sink, entry, deleted, resumed,
                        entry.message)


def _wait_for_runs_to_end(pipeline: Pipeline, epoch: int) -> None:
    """The pause fenced the runs; wait until they have left (they commit or drop their batch in flight and
    close their Kafka consumer). A run past its lease is not waited for: if it wakes, its Kafka commits are
    refused at its old epoch (lifecycle.KafkaPositions), so it cannot commit over the rewind's offsets."""
    def alive() -> list[int]:
        return list(ConsumerRun.objects.filter(pipeline=pipeline, epoch__lt=epoch).alive(timezone.now())
                    .values_list("pk", flat=True))

    if waiting.wait_until(lambda: not alive(), settings.TALLY_REWIND_STOP_TIMEOUT_SECONDS):
        return
    left = alive()
    if left:
        raise Refused(f"Run(s) {', '.join(map(str, left))} of pipeline {pipeline.name!r} did not end within "
                      f"{settings.TALLY_REWIND_STOP_TIMEOUT_SECONDS} s of the pause; nothing was moved.")


def _apply(pipeline: Pipeline, spec: OffsetSpec, moves: list[PartitionMove], rollback_sink: bool,
           entry: ActionLog) -> dict[int, int]:
    """The one transaction of a rewind. Returns the sink rows deleted per partition. Kafka's committed offsets move
    inside it, before it commits: a classic pipeline resumes from them, so Kafka refusing them must leave nothing
    moved. Should the transaction then fail to commit, Kafka's offsets are put back as they were (an exactly-once
    pipeline's only when they could be read first: its Kafka offsets are advisory, and Kafka down does not hold up
    its rewind)."""
    try:
        kafka_before = kafka_admin.committed_offsets(pipeline.group_id, pipeline.topic, [m.partition for m in moves],
                                                     cluster=pipeline.cluster)
    except KAFKA_ERRORS:
        if not pipeline.is_exactly_once:
            raise   # refused: nothing moved yet
        kafka_before = None
    deleted: dict[int, int] = {}
    moved_in_kafka = False
    try:
        with transaction.atomic():
            Pipeline.objects.select_for_update().get(pk=pipeline.pk)
            before = {p: (n, until) for p, n, until in PartitionOffset.objects.select_for_update()
                      .filter(pipeline=pipeline, partition__in=[m.partition for m in moves]).order_by("partition")
                      .values_list("partition", "next_offset", "replay_until")}
            with connection.cursor() as cursor:
                for move in moves:
                    old, old_until = before.get(move.partition, (None, None))
                    if rollback_sink:
                        deleted[move.partition] = sinks.delete_rows_from(cursor, pipeline.sink_table, pipeline.topic,
                                                                         move.partition, move.new)
                    _move_position(cursor, pipeline, move, old, old_until, keep_sink=not rollback_sink)
            note = _commit_to_kafka(pipeline, moves)
            moved_in_kafka = not note
            message = _summary(spec, moves, rollback_sink, deleted) + note
            ActionLog.objects.filter(pk=entry.pk).update(
                # Where each partition resumed, as the plan moved it (Kafka's offset for the classic modes, not
                # the database's): reconciliation reads a range skipped on purpose from these two.
                offsets_before=offsets_of(moves, "current"), offsets_after=offsets_of(moves, "new"),
                params={**entry.params, "plan": [m.as_dict() for m in moves], "rows_deleted": deleted},
                result=ActionResult.DONE, message=message, finished_at=timezone.now())
    except Exception as exc:
        if not moved_in_kafka or kafka_before is None:
            raise
        raise RewindNotCommitted(f"the database did not commit the rewind ({type(exc).__name__}: {exc}); "
                                 f"{_put_kafka_back(pipeline, kafka_before)}") from exc
    log.info("%s rewound: %s", pipeline.name, message)
    return deleted


def _put_kafka_back(pipeline: Pipeline, offsets: dict[int, int | None]) -> str:
    """Commit the group's offsets as they were before the rewind; says what was done, for the audit. A partition
    the group had no offset for cannot be given back none: it keeps the rewind's, and the text names it."""
    kept = {p: o for p, o in offsets.items() if o is not None}
    unset = sorted(p for p, o in offsets.items() if o is None)
    group = pipeline.group_id
    try:
        if kept:
            kafka_admin.commit_offsets(group, pipeline.topic, kept, cluster=pipeline.cluster)
    except Exception as exc:  # noqa: BLE001 - said in the audit: an operator must move them back
        return (f"Kafka's committed offsets of group {group!r} stay moved: putting them back to "
                f"{_listed(kept)} failed ({type(exc).__name__}: {exc})")
    text = f"Kafka's committed offsets of group {group!r} were put back to {_listed(kept)}"
    if unset:
        text += f" (partitions {', '.join(map(str, unset))} had none, and keep the rewind's)"
    return text + "; nothing else was moved"


def _listed(offsets: dict[int, int]) -> str:
    return ", ".join(f"p{p} {o}" for p, o in sorted(offsets.items())) or "none"


def _move_position(cursor, pipeline: Pipeline, move: PartitionMove, old, old_until, *, keep_sink: bool) -> None:
    replay_until = None
    if keep_sink:
        # Rows up to the old position may exist: exactly-once inserts replays below it idempotently, and a later
        # rewind of any mode counts what it gives back from there, not from the moved-back position.
        replay_until = max(x for x in (old, old_until, move.new) if x is not None)
        replay_until = replay_until if replay_until > move.new else None
    cursor.execute(sql.SQL("INSERT INTO {} (pipeline_id, partition, next_offset, replay_until, updated_at) "
                           "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (pipeline_id, partition) DO UPDATE "
                           "SET next_offset = EXCLUDED.next_offset, replay_until = EXCLUDED.replay_until, "
                           "updated_at = now()").format(table(PartitionOffset)),
                   [pipeline.pk, move.partition, move.new, replay_until])
    # Ledger rows reaching past the new offset now cover only [first_offset, new offset).
    cursor.execute(sql.SQL("UPDATE {} SET superseded_from = LEAST(COALESCE(superseded_from, end_offset), %s) "
                           "WHERE pipeline_id = %s AND partition = %s AND end_offset > %s"
                           ).format(table(BatchLedger)),
                   [move.new, pipeline.pk, move.partition, move.new])
    PartitionHealth.objects.filter(pipeline=pipeline, partition=move.partition).verify_again_from(move.new)
    # The rows it trimmed were folded into the pages' ledger summary: it is folded again from the ledger.
    LedgerSummary.objects.filter(pipeline=pipeline, partition=move.partition).delete()


def _commit_to_kafka(pipeline: Pipeline, moves: list[PartitionMove]) -> str:
    offsets = {m.partition: m.new for m in moves}
    try:
        kafka_admin.commit_offsets(pipeline.group_id, pipeline.topic, offsets, cluster=pipeline.cluster)
    except Exception as exc:
        if not pipeline.is_exactly_once:
            # The classic modes resume from Kafka: without this commit the rewind would not happen.
            raise Refused(f"Kafka refused the new offsets of group {pipeline.group_id!r} ({exc}); "
                          f"nothing was moved.") from exc
        log.warning("%s: Kafka offset commit after rewind failed (advisory): %s", pipeline.name, exc)
        return f"; Kafka's committed offsets were not updated ({exc}); the pipeline resumes from the database"
    return ""


def _summary(spec: OffsetSpec, moves: list[PartitionMove], rollback_sink: bool, deleted=None, *,
             planned: bool = False) -> str:
    parts = ", ".join(f"p{m.partition} {m.current}->{m.new}" for m in moves)
    text = (f"{spec.describe()}: {parts}; {sum(m.reprocess for m in moves)} record(s) to reprocess, "
            f"{sum(m.skip for m in moves)} to skip")
    if written := [m for m in moves if m.delivered is not None]:
        text += (f" (counted from where the sink was written up to, past Kafka's committed offsets: "
                 f"{', '.join(f'p{m.partition} {m.delivered}' for m in written)})")
    if rollback_sink and deleted is not None:
        text += (f"; sink rows at or beyond the new offsets {'to delete' if planned else 'deleted'}: "
                 f"{sum(deleted.values())}")
    elif rollback_sink:
        text += "; sink rows at or beyond the new offsets will be deleted"
    return text
