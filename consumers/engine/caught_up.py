"""Is a pipeline caught up? Every partition of its topic must have its stored position at the log end.

Judged from the database positions, never from one run's assignment: a run that holds one partition
while dead members still hold the others (until their sessions expire) must not call the pipeline done.
Partitions the pipeline never stored a position for (added to the topic, or never assigned) are not
caught up unless they are empty. The classic modes resume from Kafka's committed offset, so for them the
further of the two positions counts.
"""
from dataclasses import dataclass, field

from consumers.kafka import admin as kafka_admin
from consumers.models import PartitionOffset


@dataclass
class CaughtUp:
    done: bool
    behind: dict[int, tuple[int | None, int]] = field(default_factory=dict)  # partition: (position, log end)

    def describe(self) -> str:
        if self.done:
            return "every partition is at its log end"
        return "; ".join(f"partition {p} at {'no position' if pos is None else pos} of {end}"
                         for p, (pos, end) in sorted(self.behind.items()))


def stored_positions(pipeline) -> dict[int, int]:
    return dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))


def topic_caught_up(pipeline, *, kafka=None) -> CaughtUp:
    kafka = kafka or kafka_admin.on(pipeline.cluster)
    marks = kafka.watermarks(pipeline.topic)
    positions = stored_positions(pipeline)
    if not pipeline.is_exactly_once:
        committed = kafka.committed_offsets(pipeline.group_id, pipeline.topic, sorted(marks))
        for p, offset in committed.items():
            if offset is not None:
                positions[p] = max(positions.get(p, offset), offset)
    behind = {}
    for p, mark in marks.items():
        position = positions.get(p)
        # mark.end: the last stable offset, as far as a read_committed consumer can read.
        empty = mark.end <= mark.log_start
        if (position is None and not empty) or (position is not None and position < mark.end):
            behind[p] = (position, mark.end)
    return CaughtUp(not behind, behind)
