"""Resetting the committed offsets of consumer groups that Tally does not run (as `kafka-consumer-groups
--reset-offsets` does): the same modes as a rewind, a dry run by default, refused while the group has
active members (their next commit would overwrite the reset) or for a group Kafka does not know (committing offsets
would create it), audited as action "reset_group".

A group that belongs to a Tally pipeline is refused here: its position lives in the database, so it is
moved with a rewind.
"""
import logging
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from consumers.access import record_refusal
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.models import ActionLog, ActionResult, Pipeline
from consumers.operations import groups as kafka_groups
from consumers.operations import offset_specs
from consumers.operations.errors import KAFKA_ERRORS, NotFound, Refused, as_refusal
from consumers.operations.offset_specs import OffsetSpec, PartitionMove, offsets_of
from consumers.pg_text import unstorable

log = logging.getLogger("tally.groups")

ACTION = "reset_group"
MAX_GROUP_ID = ActionLog._meta.get_field("group_id").max_length


@dataclass
class GroupResetResult:
    group_id: str
    topic: str
    spec: OffsetSpec
    moves: list[PartitionMove]
    executed: bool
    action_log: ActionLog
    message: str

    def as_dict(self) -> dict:
        return {"group": self.group_id, "topic": self.topic, "mode": self.spec.mode, "value": self.spec.raw or None,
                "dry_run": not self.executed, "action_id": self.action_log.pk, "result": self.action_log.result,
                "message": self.message, "partitions": [m.as_dict() for m in self.moves],
                "reprocess": sum(m.reprocess for m in self.moves), "skip": sum(m.skip for m in self.moves)}


def reset_group(group_id: str, topic: str, mode: str, value=None, *, partitions: list[int] | None = None,
                execute: bool = False, actor: str = "cli", cluster: str | None = None) -> GroupResetResult:
    """Plan (and with execute=True, apply) a reset of `group_id`'s committed offsets on `topic`.
    Raises Refused (recorded in the action log) on bad input or while the group has active members, and its
    Unavailable when Kafka cannot be used or refuses a request."""
    cluster = cluster or clusters.DEFAULT
    params = {"cluster": cluster, "topic": topic, "mode": mode, "value": None if value is None else str(value),
              "partitions": partitions or "all"}

    def refused(error: Refused) -> Refused:
        error.action_log = record_refusal(actor, ACTION, str(error), group_id=group_id, params=params,
                                          dry_run=not execute)
        return error

    if len(group_id) > MAX_GROUP_ID:  # the action log's column; Kafka sets no limit, Tally stores the name
        raise refused(Refused(f"A group id of at most {MAX_GROUP_ID} characters, not {len(group_id)}."))
    problem = unstorable(group_id) or unstorable(topic)
    if problem:
        raise refused(Refused(f"The group id or topic {problem}."))

    owner = Pipeline.objects.filter(group_id=group_id, cluster=cluster).first()
    if owner is not None:
        raise refused(Refused(f"Group {group_id!r} is run by Tally pipeline {owner.name!r}: its position is kept "
                              f"in the database, so move it with `rewind {owner.name}`."))
    try:
        spec = offset_specs.parse_spec(mode, value)
        chosen = offset_specs.choose_partitions(topic, partitions, cluster=cluster)
        # Committing offsets would create the group: one Kafka does not know is refused (its page is a 404).
        # Checked here for the dry run's answer, and again under the lock before the commit.
        if not kafka_groups.kafka_knows(group_id, cluster=cluster):
            raise NotFound(kafka_groups.unknown_group_message(group_id, cluster))
        marks = kafka_admin.watermarks(topic, chosen, cluster=cluster)
        current = kafka_admin.committed_offsets(group_id, topic, chosen, cluster=cluster)
        moves = offset_specs.resolve_offsets(spec, topic, chosen, current, marks, cluster=cluster)
    except Refused as exc:
        raise refused(exc) from None
    except KAFKA_ERRORS as exc:  # Kafka went down or refused a request: audited as a refusal, as every door says
        raise refused(as_refusal(exc)) from None
    summary = f"{spec.describe()} on {topic}: " + ", ".join(f"p{m.partition} {m.current}->{m.new}" for m in moves)
    if not execute:
        message = f"dry run: {summary}; nothing was changed (add --execute to apply)"
        entry = ActionLog.objects.create(
            group_id=group_id, action=ACTION, actor=actor, params={**params, "plan": [m.as_dict() for m in moves]},
            dry_run=True, offsets_before=offsets_of(moves, "current"), offsets_after=offsets_of(moves, "new"),
            result=ActionResult.DONE, message=message, finished_at=timezone.now())
        return GroupResetResult(group_id, topic, spec, moves, False, entry, message)
    entry = None
    try:
        with transaction.atomic():
            problem = _refusal_under_lock(group_id, cluster)
            if problem is None:
                kafka_admin.commit_offsets(group_id, topic, {m.partition: m.new for m in moves}, cluster=cluster)
                message = (f"{summary}; {sum(m.reprocess for m in moves)} record(s) to reprocess, "
                           f"{sum(m.skip for m in moves)} to skip")
                entry = ActionLog.objects.create(
                    group_id=group_id, action=ACTION, actor=actor,
                    params={**params, "plan": [m.as_dict() for m in moves]},
                    offsets_before=offsets_of(moves, "current"), offsets_after=offsets_of(moves, "new"),
                    result=ActionResult.DONE, message=message, finished_at=timezone.now())
    except KAFKA_ERRORS as exc:  # the transaction rolled back (and let the lock go); the refusal is written after
        raise refused(as_refusal(exc)) from None
    if problem is not None:
        raise refused(problem)
    log.info("group %s reset by %s: %s", group_id, actor, message)
    return GroupResetResult(group_id, topic, spec, moves, True, entry, message)


def _refusal_under_lock(group_id: str, cluster: str) -> Refused | None:
    """Inside the reset's transaction: take the group's advisory lock (one reset of a group at a time), then
    check what must hold at the commit, serialized with the other resets: the group still exists (it may have
    been deleted since the plan, and committing would create it again) and has no active member."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", [f"tally-group:{cluster}:{group_id}"])
        if not cursor.fetchone()[0]:
            return Refused(f"Another reset of group {group_id!r} is running. Try again when it has finished.")
    if not kafka_groups.kafka_knows(group_id, cluster=cluster):
        return NotFound(kafka_groups.unknown_group_message(group_id, cluster))
    described = kafka_admin.describe_group(group_id, cluster=cluster)
    if described.has_active_members:
        return Refused(f"Group {group_id!r} has {len(described.members) or 'some'} active member(s) "
                       f"(state {described.state}): stop its consumers first. Nothing was changed.")
    return None
