"""The offset timeline of a pipeline: per partition, what the ledger covers, where it has gaps and
overlaps, where its batches crossed holes (positions holding no data record: transaction markers,
aborted or compacted records -- drawn apart from gaps, because a hole is never a loss), and where
operators rewound — computed in PostgreSQL and drawn as server-side SVG.

Coverage, gaps, overlaps, rewinds and holes come from the ledger summary
(consumers/reconciliation/ledger_summary.py: the sweep of consumers/reconciliation/coverage.py, the definition
reconciliation verifies with, kept incrementally), plus the rows committed since it was refreshed, so the cost
does not grow with the ledger.
"""
from dataclasses import dataclass, field

from consumers.reconciliation import ledger_summary

# More anomalies than this in one partition are summarised: the drawing would be unreadable anyway.
MAX_MARKS_PER_PARTITION = 50

@dataclass
class PartitionTimeline:
    partition: int
    covered_from: int | None = None
    covered_to: int | None = None
    batches: int = 0
    gaps: list[tuple[int, int]] = field(default_factory=list)
    overlaps: list[tuple[int, int]] = field(default_factory=list)
    rewinds: list[int] = field(default_factory=list)
    holey: list[tuple[int, int]] = field(default_factory=list)  # batch ranges that crossed holes (merged)
    holes: int = 0                                               # positions in them holding no record
    log_start: int | None = None
    high_watermark: int | None = None
    next_offset: int | None = None

    @property
    def covered(self) -> list[tuple[int, int]]:
        """Covered ranges: the ledger's bounds minus its gaps."""
        if self.covered_from is None:
            return []
        ranges, start = [], self.covered_from
        for gap_start, gap_end in sorted(self.gaps):
            if gap_start > start:
                ranges.append((start, gap_start))
            start = max(start, gap_end)
        if self.covered_to > start:
            ranges.append((start, self.covered_to))
        return ranges

    @property
    def domain(self) -> tuple[int, int]:
        points = [p for p in (self.log_start, self.high_watermark, self.next_offset, self.covered_from,
                              self.covered_to, *self.rewinds) if p is not None]
        if not points:
            return 0, 1
        lo, hi = min(points), max(points)
        return lo, max(hi, lo + 1)

    def as_json(self) -> dict:
        return {"partition": self.partition, "covered": self.covered, "gaps": self.gaps,
                "overlaps": self.overlaps, "rewinds": self.rewinds, "batches": self.batches,
                "holes": self.holes, "holey": self.holey}


def ledger_timelines(pipeline, partitions=()) -> list[PartitionTimeline]:
    """One PartitionTimeline per partition that has ledger rows or appears in `partitions` (rows with
    log_start/high_watermark/next_offset from dashboard.status.partition_rows)."""
    timelines: dict[int, PartitionTimeline] = {}
    for partition, summary in ledger_summary.read(pipeline.pk).items():
        timelines[partition] = PartitionTimeline(
            partition, covered_from=summary.first, covered_to=summary.end, batches=summary.batches,
            gaps=[tuple(g) for g in summary.gaps[:MAX_MARKS_PER_PARTITION]],
            overlaps=[tuple(o) for o in summary.overlaps[:MAX_MARKS_PER_PARTITION]],
            rewinds=summary.rewinds[:MAX_MARKS_PER_PARTITION], holes=summary.holes,
            holey=[tuple(h) for h in summary.holey[:MAX_MARKS_PER_PARTITION]])
    for row in partitions:
        timeline = timelines.setdefault(row.partition, PartitionTimeline(row.partition))
        timeline.log_start, timeline.high_watermark = row.log_start, row.high_watermark
        timeline.next_offset = row.next_offset
    if getattr(pipeline, "reset_policy", "earliest") == "earliest":
        for timeline in timelines.values():
            # A pipeline that starts at the log start but whose first batch begins later never wrote the
            # records in between (an at-most-once crash on the first batch): the first gap.
            if (timeline.log_start is not None and timeline.covered_from is not None
                    and timeline.log_start < timeline.covered_from and not timeline.rewinds):
                timeline.gaps.insert(0, (timeline.log_start, timeline.covered_from))
                timeline.covered_from = timeline.log_start
    return [timelines[p] for p in sorted(timelines)]


# --- drawing ----------------------------------------------------------------------------------------
WIDTH = 1000.0  # SVG user units; the drawing scales to the page width (viewBox 0 0 1000 40)


def _x(offset: int, lo: int, hi: int) -> float:
    return round((offset - lo) / (hi - lo) * WIDTH, 2)


def svg_shapes(timeline: PartitionTimeline) -> dict:
    """Rectangles and markers in SVG user units (viewBox 0 0 1000 40) for the template to draw."""
    lo, hi = timeline.domain

    def span(a, b):
        x = _x(a, lo, hi)
        return {"x": x, "w": max(_x(b, lo, hi) - x, 1.5), "from": a, "to": b}

    shapes = {"covered": [span(a, b) for a, b in timeline.covered],
              "gaps": [span(a, b) for a, b in timeline.gaps],
              "overlaps": [span(a, b) for a, b in timeline.overlaps],
              "holey": [span(a, b) for a, b in timeline.holey],
              "rewinds": [{"x": _x(o, lo, hi), "offset": o} for o in timeline.rewinds],
              "lo": lo, "hi": hi}
    if timeline.log_start is not None and timeline.high_watermark is not None:
        shapes["log"] = span(timeline.log_start, timeline.high_watermark)
    if timeline.next_offset is not None:
        shapes["position"] = {"x": _x(timeline.next_offset, lo, hi), "offset": timeline.next_offset}
    return shapes
