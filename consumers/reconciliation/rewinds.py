"""Operator rewinds as reconciliation and alerts see them: planned, not incidents. The one place that reads
rewinds back from the action log.

A rewind back replays `[new, old)`: the commit protocol and consumers/operations/rewind.py keep that exact (ledger rows
superseded, sink rolled back or replayed idempotently), so nothing is reported there. A rewind FORWARD
skips `[old, new)` on purpose: those offsets have no row and no ledger row, which reconciliation finds as
lost and gap; such findings are marked `"planned": true`, are not counted as lost, and do not make the
status ERR, until a later rewind back reads them again. Alerts treat both directions as planned: a skipped range
raises no loss or gap alert, nor a range being replayed (until the replay passes it), and a rewind no stall alert.
The action log (ActionLog) holds the offsets before and after as {"partition": offset}.
"""
from dataclasses import dataclass, field, replace
from datetime import datetime

from consumers.models import ActionLog
from consumers.models.operations import REWIND_ACTIONS  # noqa: F401  (public name of this module)
from consumers.reconciliation.findings import Finding

PLANNED_KINDS = ("lost", "gap")   # contiguous kinds: count == end - start


@dataclass
class Rewind:
    """One rewind that took effect: positions per partition before and after it."""

    at: datetime
    before: dict[int, int]
    after: dict[int, int]

    def moves(self):
        """(partition, before, after) for every partition the rewind logged on both sides."""
        for partition in sorted(self.before.keys() & self.after.keys()):
            yield partition, self.before[partition], self.after[partition]


def effective_rewinds(pipeline) -> list[Rewind]:
    """Rewinds of a pipeline that took effect (dry runs and refused/failed ones changed nothing), oldest first."""
    return effective_rewinds_of([pipeline.pk]).get(pipeline.pk, [])


def effective_rewinds_of(pipeline_ids) -> dict[int, list[Rewind]]:
    """`effective_rewinds` of many pipelines in one query (an alert pass): {pipeline id: rewinds, oldest first};
    a pipeline never rewound is absent."""
    actions = (ActionLog.objects.rewinds_in_effect().filter(pipeline_id__in=list(pipeline_ids))
               .order_by("created_at", "pk"))
    found: dict[int, list[Rewind]] = {}
    for pipeline_id, at, before, after in actions.values_list("pipeline_id", "created_at", "offsets_before",
                                                              "offsets_after"):
        found.setdefault(pipeline_id, []).append(Rewind(at, _partition_offsets(before), _partition_offsets(after)))
    return found


def _offset(value) -> int | None:
    """Offsets in ActionLog are {partition: n} or {partition: {"next_offset": n, ...}}."""
    if isinstance(value, dict):
        value = value.get("next_offset", value.get("offset"))
    if isinstance(value, bool):
        return None
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
        if number is not None and str(partition).isdigit():
            result[int(partition)] = number
    return result


# --- as reconciliation sees them ----------------------------------------------------------------------
@dataclass
class Rewinds:
    skipped: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # ranges rewinds forward skipped
    recent: bool | set[int] | None = None   # rewound within the window: True (all partitions) or a set

    def recently_rewound(self, partition: int) -> bool:
        return self.recent is True or partition in (self.recent or ())


def load(pipeline, since: datetime) -> Rewinds:
    """Every rewind of the pipeline that took effect (one query): what forward rewinds skipped, and which
    partitions were rewound since `since`."""
    history = effective_rewinds(pipeline)
    rewinds = Rewinds(skipped=skipped_ranges(history))
    recent: set[int] = set()
    for rewind in history:
        if rewind.at >= since and rewinds.recent is not True:
            if not rewind.after:
                rewinds.recent = True
            else:
                recent.update(rewind.after)
    if rewinds.recent is None and recent:
        rewinds.recent = recent
    return rewinds


def skipped_ranges(history: list[Rewind]) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the ranges that rewinds forward skipped and that are still skipped: a later rewind back to
    `after` reads everything from there again, so a skipped range from there on is dropped (cut where it began
    before `after`); its records are then written or lost like any other."""
    skipped: dict[int, list[tuple[int, int]]] = {}
    for rewind in history:
        for p, before, after in rewind.moves():
            if after > before:
                skipped.setdefault(p, []).append((before, after))
            elif after < before and p in skipped:
                skipped[p] = [(start, min(end, after)) for start, end in skipped[p] if start < after]
    return skipped


def skipped_by_a_rewind(pipeline, partition: int, offset: int) -> bool:
    """An operator's rewind forward moved the partition past `offset`, and no later rewind read it again."""
    return any(start <= offset < end for start, end in skipped_ranges(effective_rewinds(pipeline)).get(partition, ()))


def mark_planned(findings: list[Finding], skipped: list[tuple[int, int]]) -> list[Finding]:
    """Split lost/gap findings along the skipped ranges; the parts inside are marked planned."""
    if not skipped:
        return findings
    result = []
    for finding in findings:
        contiguous = finding.kind in PLANNED_KINDS and finding.count == finding.end - finding.start
        if not contiguous:
            result.append(finding)
            continue
        for start, end, planned in _split(finding.start, finding.end, skipped):
            result.append(replace(finding, start=start, end=end, count=end - start, planned=True if planned else None))
    return result


def _split(start: int, end: int, ranges: list[tuple[int, int]]):
    """[start, end) cut into (s, e, inside any range?) pieces, in order."""
    cuts = sorted({start, end, *(o for r in ranges for o in r if start < o < end)})
    for s, e in zip(cuts, cuts[1:], strict=False):
        yield s, e, any(rs <= s and e <= re for rs, re in ranges)


# --- as alerts see them -------------------------------------------------------------------------------
@dataclass
class PartitionRewind:
    before: int
    after: int

    @property
    def range(self) -> tuple[int, int]:
        return min(self.before, self.after), max(self.before, self.after)


@dataclass
class PipelineRewinds:
    """The ranges rewinds forward skipped and that stay skipped (skipped_ranges), the latest rewind per partition,
    and when the latest rewind happened."""

    skipped: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    latest: dict[int, PartitionRewind] = field(default_factory=dict)
    latest_at: datetime | None = None

    def planned_ranges(self, partition: int, next_offset: int | None) -> list[tuple[int, int]]:
        """What an operator's rewinds account for: the ranges skipped on purpose, and the range a rewind back
        replays while it is being replayed. A loss found there once the replay is past it is a loss."""
        ranges = list(self.skipped.get(partition, []))
        if self.replay_end(partition, next_offset) is not None:
            ranges.append(self.latest[partition].range)
        return ranges

    def replay_end(self, partition: int, next_offset: int | None) -> int | None:
        """The old position while a rewind back is being replayed (next_offset below it), else None."""
        rewind = self.latest.get(partition)
        if rewind is None or next_offset is None or rewind.after >= rewind.before:
            return None
        return rewind.before if rewind.after <= next_offset < rewind.before else None


def rewinds_for(pipeline, rewinds: list[Rewind] | None = None) -> PipelineRewinds:
    """`rewinds`: the pipeline's effective rewinds when already read (effective_rewinds_of), else read now."""
    history = effective_rewinds(pipeline) if rewinds is None else rewinds
    found = PipelineRewinds(skipped=skipped_ranges(history))
    for rewind in history:
        for partition, before, after in rewind.moves():
            found.latest[partition] = PartitionRewind(before, after)
        found.latest_at = rewind.at
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
