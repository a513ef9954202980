"""Operator rewinds as reconciliation sees them: planned, not incidents.

A rewind back replays `[new, old)`: the commit protocol and consumers/operations/rewind.py keep that exact (ledger rows
superseded, sink rolled back or replayed idempotently), so nothing is reported there. A rewind FORWARD
skips `[old, new)` on purpose: those offsets have no row and no ledger row, which reconciliation finds as
lost and gap; such findings are marked `"planned": true`, are not counted as lost, and do not make the
status ERR. The audit log (ActionLog) holds the offsets before and after as {"partition": offset}.
"""
from dataclasses import dataclass, field
from datetime import datetime

from consumers.models import ActionLog, ActionResult

REWIND_ACTIONS = ("rewind", "reset_group")
PLANNED_KINDS = ("lost", "gap")   # contiguous kinds: count == end - start


def _effective(pipeline):
    return (ActionLog.objects.filter(pipeline=pipeline, action__in=REWIND_ACTIONS, dry_run=False)
            .exclude(result__in=(ActionResult.REFUSED, ActionResult.FAILED)))


def _offsets(values) -> dict[int, int]:
    result = {}
    for key, value in (values or {}).items() if isinstance(values, dict) else []:
        if isinstance(value, dict):
            value = value.get("next_offset")
        if str(key).isdigit() and isinstance(value, int):
            result[int(key)] = value
    return result


@dataclass
class Rewinds:
    skipped: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # ranges rewinds forward skipped
    recent: bool | set[int] | None = None   # rewound within the window: True (all partitions) or a set

    def recently_rewound(self, partition: int) -> bool:
        return self.recent is True or partition in (self.recent or ())


def load(pipeline, since: datetime) -> Rewinds:
    """Every rewind of the pipeline that took effect (one query)."""
    rewinds = Rewinds()
    recent: set[int] = set()
    for created_at, before, after in _effective(pipeline).values_list("created_at", "offsets_before",
                                                                      "offsets_after"):
        before, after = _offsets(before), _offsets(after)
        for p in before.keys() & after.keys():
            if after[p] > before[p]:
                rewinds.skipped.setdefault(p, []).append((before[p], after[p]))
        if created_at >= since and rewinds.recent is not True:
            if not after:
                rewinds.recent = True
            else:
                recent.update(after)
    if rewinds.recent is None and recent:
        rewinds.recent = recent
    return rewinds


def mark_planned(findings: list[dict], skipped: list[tuple[int, int]]) -> list[dict]:
    """Split lost/gap findings along the skipped ranges; the parts inside are marked planned."""
    if not skipped:
        return findings
    result = []
    for finding in findings:
        contiguous = finding["kind"] in PLANNED_KINDS and finding["count"] == finding["end"] - finding["start"]
        if not contiguous:
            result.append(finding)
            continue
        for start, end, planned in _split(finding["start"], finding["end"], skipped):
            part = dict(finding, start=start, end=end, count=end - start)
            part.pop("planned", None)
            if planned:
                part["planned"] = True
            result.append(part)
    return result


def _split(start: int, end: int, ranges: list[tuple[int, int]]):
    """[start, end) cut into (s, e, inside any range?) pieces, in order."""
    cuts = sorted({start, end, *(o for r in ranges for o in r if start < o < end)})
    for s, e in zip(cuts, cuts[1:], strict=False):
        yield s, e, any(rs <= s and e <= re for rs, re in ranges)
