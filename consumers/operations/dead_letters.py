"""Dead letters: replay them through the pipeline's current transform, or discard them with a reason.

The admin, the dead-letter page, the API and the command line call these functions; each call is one
audited operator action (`ActionLog` "replay_dead_letters" / "discard_dead_letters"), refusals included.

Steps of `replay`:
  1. Validate (the pipeline exists, ids are given, not too many, the transform resolves, every id is a dead
     letter of this pipeline, pending, discarded or already replayed); with
     source="kafka", read the records at the dead letters' offsets from Kafka (read_committed) before any
     lock is taken — a record Kafka no longer holds refuses the whole call.
  2. Open ONE PostgreSQL transaction; lock the pipeline row FOR SHARE and the partitions' offset rows
     FOR UPDATE in partition order, as the commit protocol does: no batch and no rewind of those
     partitions interleaves with the replay.
  3. Lock the dead letters FOR UPDATE, in (partition, offset) order. A dead letter already replayed is
     gone (reported as such: replaying twice is a no-op); a discarded one is left alone; one at or beyond
     the partition's `next_offset` is left to the pipeline, which will read it again.
  4. Run each record (stored key/value, or the Kafka copy) through the pipeline's CURRENT transform. A
     record that fails again stays a dead letter with the new error and one more replay attempt.
  5. Write the sink rows with their provenance, skipping a record whose rows the sink already holds
     (idempotent on the provenance key: `source_topic`, `source_partition`, `source_offset`). A record whose
     rows PostgreSQL refuses for their data (a CHECK) stays a dead letter as in step 4, with the database's
     reason; the others are written (bisection under savepoints, as the commit protocol does).
  6. Delete the replayed dead letters and insert one replay-ledger row each (`DeadLetterReplay`, unique on
     the dead letter), so every offset keeps exactly one outcome (rows or a dead letter), as
     reconciliation requires; move reconciliation's verified mark back to the first replayed offset (it
     re-reads them, as after a rewind); write the action log entry.
  7. COMMIT. A crash anywhere before leaves everything as it was; after it, a second replay finds nothing.
Fault points `replay-mid-write`, `replay-after-write` and `after-replay-commit` (consumers/engine/faults.py)
make each step's crash reproducible.
"""
import logging
from dataclasses import dataclass, field

from django.db import connection, models, transaction
from django.utils import timezone
from psycopg2 import sql

from consumers.engine import poison, sinks
from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.tables import table
from consumers.engine.transforms import SourceRecord, Transform, for_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka.errors import ClusterConfigError
from consumers.models import (
    ActionLog,
    ActionResult,
    DeadLetter,
    DeadLetterReplay,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
)
from consumers.operations import actions
from consumers.operations.errors import KAFKA_ERRORS, Unavailable
from consumers.pg_text import exception_text

log = logging.getLogger("tally.dead_letters")

REPLAY = "replay_dead_letters"
DISCARD = "discard_dead_letters"
SOURCES = ("stored", "kafka")
# One call replays at most this many dead letters: one transaction holds their locks and rows, and the
# pipeline's batches on those partitions wait for it.
MAX_PER_CALL = 1000
MAX_REASON = 500
# A discard needs a reason: the operation's refusal, and the prompt the form and the API show beside the field.
REASON_NEEDED = "Discarding dead letters needs a reason."
REASON_PROMPT = "Say why these dead letters are discarded."


class LetterOutcome(models.TextChoices):
    """What happened to one dead letter; the label is how a summary says it."""
    REPLAYED = "replayed", "replayed into the sink"
    ALREADY_IN_SINK = "already_in_sink", "already in the sink (dead letter removed)"
    STILL_BAD = "still_bad", "still bad (kept with the new error)"
    GONE = "gone", "not found (already replayed?)"
    DISCARDED = "discarded", "discarded (not replayed)"
    NOT_YET_CONSUMED = "not_yet_consumed", "not yet consumed (left to the pipeline)"
    ALREADY_DISCARDED = "already_discarded", "already discarded"


@dataclass(frozen=True)
class Outcome:
    """What happened to one dead letter."""

    dead_letter_id: int
    partition: int | None
    offset: int | None
    result: LetterOutcome
    rows: int = 0
    error: str = ""

    def as_dict(self) -> dict:
        return {"id": self.dead_letter_id, "partition": self.partition, "offset": self.offset,
                "result": self.result, "rows": self.rows, "error": self.error}


@dataclass
class DeadLetterResult:
    pipeline: str
    action: str
    outcomes: list[Outcome]
    action_log: ActionLog
    message: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "action": self.action, "action_id": self.action_log.pk,
                "message": self.message, "counts": self.counts, "dead_letters": [o.as_dict() for o in self.outcomes]}


def _clean_ids(pipeline, action, actor, params, ids) -> list[int]:
    try:
        cleaned = sorted({int(i) for i in ids})
    except (TypeError, ValueError):
        actions.refuse(pipeline, action, actor, params, "Dead letter ids must be integers.")
    if not cleaned:
        actions.refuse(pipeline, action, actor, params, "No dead letters selected.")
    if len(cleaned) > MAX_PER_CALL:
        actions.refuse(pipeline, action, actor, params,
                       f"At most {MAX_PER_CALL} dead letters per call, got {len(cleaned)}.")
    return cleaned


def unknown_ids(pipeline: Pipeline, ids) -> list[int]:
    """The ids that were never dead letters of `pipeline` (a typo, another pipeline's letter), in the given order.
    A dead letter already replayed is known (its replay-ledger row): replaying it again is a no-op, not an error."""
    known = set(DeadLetter.objects.filter(pipeline=pipeline, pk__in=ids).values_list("pk", flat=True))
    known |= set(DeadLetterReplay.objects.filter(pipeline=pipeline, dead_letter_id__in=ids)
                 .values_list("dead_letter_id", flat=True))
    return [i for i in ids if i not in known]


def refuse_unknown(pipeline: Pipeline, action: str, actor: str, params: dict, ids) -> None:
    """Refuse (audited, raises Refused) if any of `ids` is not a dead letter of `pipeline` (see unknown_ids).
    Callers that split many ids into calls check them all first with this, so a bad id refuses the whole set."""
    unknown = unknown_ids(pipeline, ids)
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
        actions.refuse(pipeline, action, actor, params,
                       f"Not dead letters of pipeline {pipeline.name!r}: {shown}. Nothing was changed.")


def replay(pipeline, dead_letter_ids, actor: str = "cli", *, source: str = "stored",
           faults: FaultInjector = NO_FAULTS) -> DeadLetterResult:
    """Replay the dead letters `dead_letter_ids` of `pipeline` (a name or a Pipeline). Raises Refused
    (recorded in the action log, nothing changed) on bad input, and its Unavailable when source="kafka" and Kafka
    cannot be read now."""
    params = {"ids": [str(i) for i in dead_letter_ids][:MAX_PER_CALL], "source": source}
    pipeline = actions.lookup(pipeline, REPLAY, actor, params)
    ids = _clean_ids(pipeline, REPLAY, actor, params, dead_letter_ids)
    params["ids"] = ids
    if source not in SOURCES:
        actions.refuse(pipeline, REPLAY, actor, params, f"Unknown source {source!r}: use one of {', '.join(SOURCES)}.")
    if source == "kafka" and (problem := actions.cluster_problem(pipeline)):
        # Not Kafka being down: the clusters file no longer has the cluster (or its settings are wrong), so waiting
        # would not help. A replay of the stored copies needs no cluster and goes on.
        _refuse_cluster(pipeline, actor, params, problem)
    if pipeline.is_upsert:
        actions.refuse(pipeline, REPLAY, actor, params,
                       "Pipeline keeps one row per key (upsert): a replayed old record would overwrite newer rows. "
                       "Rewind the pipeline instead.")
    try:
        transform = for_pipeline(pipeline)
    except (LookupError, ValueError) as exc:
        actions.refuse(pipeline, REPLAY, actor, params, f"The pipeline's transform cannot be loaded: {exc}")
    unstored = _unstored_sources(pipeline) if source == "stored" else []
    if unstored:
        actions.refuse(pipeline, REPLAY, actor, params,
                       f"The mapping reads {', '.join(unstored)}, which a dead letter's stored copy does not keep "
                       "(only its key and value): replay from Kafka instead. Nothing was changed.")
    refuse_unknown(pipeline, REPLAY, actor, params, ids)
    from_kafka = None
    if source == "kafka":
        from_kafka = _read_from_kafka(pipeline, ids, actor, params)
    try:
        with transaction.atomic():
            result = _replay_locked(pipeline, ids, transform, from_kafka, source, actor, params, faults)
    except Exception as exc:  # rolled back; the failure is audited (e.g. a sink table the transform no longer fits)
        ActionLog.objects.create(pipeline=pipeline, action=REPLAY, actor=actor, params=params,
                                 result=ActionResult.FAILED, message=f"{type(exc).__name__}: {exc}",
                                 finished_at=timezone.now())
        raise
    faults.maybe_crash("after-replay-commit")
    return result


def _read_from_kafka(pipeline, ids, actor, params) -> dict[tuple[int, int], tuple]:
    wanted: dict[int, list[int]] = {}
    for partition, offset in DeadLetter.objects.filter(pipeline=pipeline, pk__in=ids).values_list("partition",
                                                                                                   "offset"):
        wanted.setdefault(partition, []).append(offset)
    try:
        found = kafka_admin.read_records(pipeline.topic, wanted, cluster=pipeline.cluster)
    except ClusterConfigError as exc:  # settings found wrong only when a client is built (a secret file gone)
        _refuse_cluster(pipeline, actor, params, str(exc))
    except KAFKA_ERRORS as exc:  # Kafka down or refusing the read: not the request's fault, doors answer 503
        actions.refuse(pipeline, REPLAY, actor, params, str(Unavailable.of(exc)), kind=Unavailable)
    missing = [f"p{p}@{o}" for p, offsets in sorted(wanted.items()) for o in offsets if (p, o) not in found]
    if missing:
        actions.refuse(pipeline, REPLAY, actor, params,
                       f"Kafka no longer holds {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} "
                       f"(retention or compaction): replay from the stored value instead. Nothing was changed.")
    return found


def _refuse_cluster(pipeline, actor, params, problem: str):
    actions.refuse(pipeline, REPLAY, actor, params, f"Cannot replay dead letters of pipeline {pipeline.name!r} from "
                                                    f"Kafka: {problem}. Nothing was changed.")


def _replay_locked(pipeline: Pipeline, ids, transform: Transform, from_kafka, source, actor, params,
                   faults) -> DeadLetterResult:
    letters_table = table(DeadLetter)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR SHARE").format(table(Pipeline)), [pipeline.pk])
        cur.execute(sql.SQL("SELECT DISTINCT partition FROM {} WHERE pipeline_id = %s AND id = ANY(%s)")
                    .format(letters_table), [pipeline.pk, ids])
        partitions = sorted(p for (p,) in cur.fetchall())
        cur.execute(sql.SQL("SELECT partition, next_offset FROM {} WHERE pipeline_id = %s "
                            "AND partition = ANY(%s) ORDER BY partition FOR UPDATE").format(table(PartitionOffset)),
                    [pipeline.pk, partitions])
        positions = dict(cur.fetchall())
        cur.execute(sql.SQL('SELECT id, partition, "offset", key, value, error, discarded_at FROM {} '
                            'WHERE pipeline_id = %s AND id = ANY(%s) ORDER BY partition, "offset" FOR UPDATE')
                    .format(letters_table), [pipeline.pk, ids])
        letters = cur.fetchall()
        outcomes, replayed, still_bad = [], [], []
        groups, written = [], []   # each record's rows, and its index in `outcomes` and `replayed`
        seen = {row[0] for row in letters}
        outcomes += [Outcome(i, None, None, LetterOutcome.GONE, error="no such dead letter (already replayed?)")
                     for i in ids if i not in seen]
        in_sink = _offsets_in_sink(cur, pipeline, [(p, o) for _, p, o, *_ in letters])
        for letter_id, partition, offset, key, value, error, discarded_at in letters:
            if discarded_at is not None:
                outcomes.append(Outcome(letter_id, partition, offset, LetterOutcome.DISCARDED,
                                        error="discarded: not replayed"))
                continue
            if offset >= positions.get(partition, 0):
                outcomes.append(Outcome(letter_id, partition, offset, LetterOutcome.NOT_YET_CONSUMED,
                                        error=f"at or beyond the pipeline's position {positions.get(partition)}: "
                                              f"the pipeline will read it again"))
                continue
            if from_kafka is not None:
                key, value, timestamp, headers = from_kafka[(partition, offset)]
            else:
                key, value, timestamp, headers = _bytes(key), _bytes(value), None, ()
            record = SourceRecord(partition, offset, key, value, timestamp, headers)
            try:
                produced = _rows(transform, pipeline.topic, record)
            except Exception as exc:  # any failure of user code is the record's fault, as in the commit protocol
                message = exception_text(exc)
                still_bad.append((letter_id, message))
                outcomes.append(Outcome(letter_id, partition, offset, LetterOutcome.STILL_BAD, error=message))
                continue
            if (partition, offset) in in_sink:
                outcomes.append(Outcome(letter_id, partition, offset, LetterOutcome.ALREADY_IN_SINK))
                replayed.append((letter_id, partition, offset, 0, error))
                continue
            groups.append(produced)
            written.append((len(outcomes), len(replayed)))
            outcomes.append(Outcome(letter_id, partition, offset, LetterOutcome.REPLAYED, rows=len(produced)))
            replayed.append((letter_id, partition, offset, len(produced), error))
        refused = _write_rows(cur, pipeline, transform, groups, faults)
        for index, reason in refused.items():   # the database refused its rows: it stays a dead letter, as in step 4
            at_outcome, at_replayed = written[index]
            letter_id, partition, offset = replayed[at_replayed][:3]
            message = f"database refused: {reason}"
            outcomes[at_outcome] = Outcome(letter_id, partition, offset, LetterOutcome.STILL_BAD, error=message)
            still_bad.append((letter_id, message))
        refused_replays = {written[index][1] for index in refused}
        replayed = [r for i, r in enumerate(replayed) if i not in refused_replays]
        now = timezone.now()
        if still_bad:
            for letter_id, message in still_bad:
                cur.execute(sql.SQL("UPDATE {} SET error = %s, replay_attempts = replay_attempts + 1, "
                                    "last_replay_at = %s WHERE id = %s").format(letters_table),
                            [message, now, letter_id])
        counts = _count(outcomes)
        message = _summary(counts)
        entry = ActionLog.objects.create(
            pipeline=pipeline, action=REPLAY, actor=actor, params={**params, "counts": counts},
            result=ActionResult.DONE, message=message, finished_at=now,
            offsets_after={f"{o.partition}@{o.offset}": o.result for o in outcomes if o.partition is not None})
        if replayed:
            cur.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(letters_table), [[r[0] for r in replayed]])
            DeadLetterReplay.objects.bulk_create([
                DeadLetterReplay(pipeline=pipeline, dead_letter_id=letter_id, partition=partition, offset=offset,
                                 source=source, rows_written=written, original_error=error, actor=actor,
                                 action_log=entry, replayed_at=now)
                for letter_id, partition, offset, written, error in replayed])
            # Reconciliation verifies incrementally: move its mark back so it re-reads the replayed offsets
            # (as a rewind does) instead of keeping their dead-letter findings.
            firsts: dict[int, int] = {}
            for _, partition, offset, _, _ in replayed:
                firsts[partition] = min(offset, firsts.get(partition, offset))
            for partition, offset in firsts.items():
                PartitionHealth.objects.filter(pipeline=pipeline, partition=partition).verify_again_from(offset)
        faults.maybe_crash("replay-after-write")
    log.info("dead letters of %s replayed by %s: %s", pipeline.name, actor, message)
    return DeadLetterResult(pipeline.name, REPLAY, outcomes, entry, message, counts)


def _unstored_sources(pipeline) -> list[str]:
    """The sources of a json pipeline's mapping that a dead letter's stored copy cannot give (its timestamp and
    headers): replayed from it, they would be missing, and their columns NULL."""
    if pipeline.transform != "json":
        return []
    return sorted({source for source in (pipeline.json_map or {}).values()
                   if source == "@timestamp" or source.startswith("@header:")})


def _bytes(value):
    return bytes(value) if value is not None else None


def _rows(transform: Transform, topic: str, record: SourceRecord) -> list[tuple]:
    """The record's sink rows with provenance, as the commit protocol builds them."""
    produced = transform.rows(record)  # raises BadRecord on no rows / too many rows
    if transform.multi_row:
        return [tuple(row) + (topic, record.partition, record.offset, i) for i, row in enumerate(produced)]
    return [(*produced[0], topic, record.partition, record.offset)]


def _offsets_in_sink(cur, pipeline: Pipeline, keys: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which (partition, offset) already have rows in the sink (a rewind re-read them, or a replay ran)."""
    if not keys:
        return set()
    cur.execute(sql.SQL("SELECT DISTINCT source_partition, source_offset FROM {} WHERE source_topic = %s "
                        "AND (source_partition, source_offset) IN (SELECT * FROM unnest(%s::int[], %s::bigint[]))")
                .format(sql.Identifier(pipeline.sink_table)),
                [pipeline.topic, [p for p, _ in keys], [o for _, o in keys]])
    return set(cur.fetchall())


def _write_rows(cur, pipeline: Pipeline, transform: Transform, groups: list[list[tuple]],
                faults: FaultInjector) -> dict[int, str]:
    """Write each record's rows (`groups`); returns {group index: the database's reason} of the records PostgreSQL
    refuses for their data (a CHECK, a value its type does not take), found as the commit protocol finds them
    (poison.find_poison): the others are written."""
    rows = [row for group in groups for row in group]
    if not rows:
        return {}
    columns = sinks.insert_columns(transform)
    cur = getattr(cur, "cursor", cur)  # COPY needs psycopg2's own cursor, not Django's wrapper

    def write(some: list[tuple]) -> None:
        sinks.copy_rows(cur, pipeline.sink_table, columns, some)

    half = len(rows) // 2 if faults.armed("replay-mid-write") else len(rows)
    # As in the commit protocol: a sink's DEFERRABLE INITIALLY DEFERRED key would be checked at COMMIT, past the
    # poison search, failing every letter of the call for one record's row.
    cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cur.execute("SAVEPOINT tally_replay")
    try:
        write(rows[:half])
        faults.maybe_crash("replay-mid-write")
        if rows[half:]:
            write(rows[half:])
    except Exception as exc:
        if not poison.is_data_error(exc):
            raise
        cur.execute("ROLLBACK TO SAVEPOINT tally_replay")
        return poison.find_poison(cur, write, groups)
    cur.execute("RELEASE SAVEPOINT tally_replay")
    return {}


def _count(outcomes: list[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[str(outcome.result)] = counts.get(str(outcome.result), 0) + 1
    return counts


def _summary(counts: dict[str, int]) -> str:
    return "; ".join(f"{counts[kind]} {kind.label}" for kind in LetterOutcome if counts.get(kind)) or "nothing to do"


def discard(pipeline, dead_letter_ids, reason: str, actor: str = "cli") -> DeadLetterResult:
    """Mark dead letters as discarded with a reason: they stay (each still accounts for its offset) but are
    never replayed. Raises Refused (audited, nothing changed) without a reason or on bad ids."""
    reason = (reason or "").strip()
    params = {"ids": [str(i) for i in dead_letter_ids][:MAX_PER_CALL], "reason": reason[:MAX_REASON]}
    pipeline = actions.lookup(pipeline, DISCARD, actor, params)
    ids = _clean_ids(pipeline, DISCARD, actor, params, dead_letter_ids)
    params["ids"] = ids
    if not reason:
        actions.refuse(pipeline, DISCARD, actor, params, REASON_NEEDED)
    if len(reason) > MAX_REASON:
        actions.refuse(pipeline, DISCARD, actor, params, f"The reason is longer than {MAX_REASON} characters.")
    refuse_unknown(pipeline, DISCARD, actor, params, ids)
    now = timezone.now()
    with transaction.atomic():
        letters = list(DeadLetter.objects.select_for_update().filter(pipeline=pipeline, pk__in=ids)
                       .order_by("partition", "offset"))
        found = {d.pk for d in letters}   # sets, not lists: a call holds up to MAX_PER_CALL ids
        outcomes = [Outcome(i, None, None, LetterOutcome.GONE, error="no such dead letter")
                    for i in ids if i not in found]
        fresh = {d.pk for d in letters if d.discarded_at is None}
        outcomes += [Outcome(d.pk, d.partition, d.offset,
                             LetterOutcome.DISCARDED if d.pk in fresh else LetterOutcome.ALREADY_DISCARDED)
                     for d in letters]
        DeadLetter.objects.filter(pk__in=fresh).update(
            discarded_at=now, discarded_by=actor[:150], discard_reason=reason)
        counts = _count(outcomes)
        message = f"{counts.get('discarded', 0)} dead letter(s) discarded: {reason}"
        if counts.get("already_discarded"):
            message += f"; {counts['already_discarded']} already discarded"
        if counts.get("gone"):
            message += f"; {counts['gone']} not found"
        entry = ActionLog.objects.create(pipeline=pipeline, action=DISCARD, actor=actor,
                                         params={**params, "counts": counts}, result=ActionResult.DONE,
                                         message=message, finished_at=now)
    log.info("dead letters of %s discarded by %s: %s", pipeline.name, actor, message)
    return DeadLetterResult(pipeline.name, DISCARD, outcomes, entry, message, counts)
