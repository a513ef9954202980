"""Planned ranges: what an operator rewind moved over, so that alerts can tell it from an incident.

A rewind forward skips `[before, after)` (those records are never processed, on purpose); a rewind back
replays `[after, before)`. Either way the range is planned: it must not raise loss, gap or stall alerts.
"""
from dataclasses import dataclass, field
from datetime import datetime

from consumers.models import ActionLog, ActionResult

REWIND_ACTIONS = ("rewind", "reset_group")


@dataclass
class PartitionRewind:
    before: int
    after: int

    @property
    def range(self) -> tuple[int, int]:
        return min(self.before, self.after), max(self.before, self.after)


@dataclass
class PipelineRewinds:
    """Every rewound range per partition, and when the latest rewind happened."""

    ranges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    latest: dict[int, PartitionRewind] = field(default_factory=dict)
    latest_at: datetime | None = None

    def planned_ranges(self, partition: int) -> list[tuple[int, int]]:
        return self.ranges.get(partition, [])

    def replay_end(self, partition: int, next_offset: int | None) -> int | None:
        """The old position while a rewind back is being replayed (next_offset below it), else None."""
        rewind = self.latest.get(partition)
        if rewind is None or next_offset is None or rewind.after >= rewind.before:
            return None
        return rewind.before if rewind.after <= next_offset < rewind.before else None


def _offset(value) -> int | None:
    """Offsets in ActionLog are {partition: n} or {partition: {"next_offset": n, ...}}."""
    if isinstance(value, dict):
        value = value.get("next_offset", value.get("offset"))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _partition_offsets(offsets) -> dict[int, int]:
    if isinstance(offsets, dict) and isinstance(offsets.get("partitions"), dict):
        offsets = offsets["partitions"]
    result = {}
    for partition, value in (offsets or {}).items() if isinstance(offsets, dict) else []:
        number = _offset(value)
        try:
            result[int(partition)] = number
        except (TypeError, ValueError):
            continue
    return {p: n for p, n in result.items() if n is not None}


def rewinds_for(pipeline) -> PipelineRewinds:
    """Rewinds of a pipeline that took effect (dry runs and refused/failed ones changed nothing)."""
    found = PipelineRewinds()
    actions = (ActionLog.objects.filter(pipeline=pipeline, action__in=REWIND_ACTIONS, dry_run=False)
               .exclude(result__in=[ActionResult.REFUSED, ActionResult.FAILED]).order_by("created_at"))
    for action in actions:
        before, after = _partition_offsets(action.offsets_before), _partition_offsets(action.offsets_after)
        for partition in before.keys() & after.keys():
            rewind = PartitionRewind(before[partition], after[partition])
            if rewind.before != rewind.after:
                found.ranges.setdefault(partition, []).append(rewind.range)
            found.latest[partition] = rewind
        found.latest_at = action.created_at
    return found


def subtract_ranges(start: int, end: int, planned: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[start, end) minus every planned range, as sorted disjoint ranges."""
    pieces = [(start, end)]
    for p_start, p_end in planned:
        next_pieces = []
        for s, e in pieces:
            if p_end <= s or p_start >= e:
                next_pieces.append((s, e))
                continue
            if s < p_start:
                next_pieces.append((s, p_start))
            if p_end < e:
                next_pieces.append((p_end, e))
        pieces = next_pieces
    return pieces
