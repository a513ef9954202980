"""Which positions of a watched topic compaction may have emptied, across changes of its cleanup.policy.

A row at a position without a record is a phantom only where the topic never compacted: reading the log
cannot tell a compacted record from a transaction marker. The policy read at a check says how the topic is
now, not how it was when the audited records were removed, so each partition remembers the log end below
which compaction may have run (`WatchPartition.compacted_below`): the high watermark at every check that
reads a compacted policy, and at the first check that reads another one after it (records written between
the last compacted reading and the switch are below that). Positions from it on were written while the topic
only deleted.
"""

COMPACTED_BEFORE_NOTE = ("the topic compacted before (positions below {below} may have been emptied by "
                         "compaction): rows at positions without a record there are not counted as phantoms")


def remember(parts: dict, marks: dict, compacted: bool | None) -> None:
    """Record this check's reading of the policy on each partition (`compacted`: None when it could not be read,
    which changes nothing)."""
    if compacted is None:
        return
    for p, wp in parts.items():
        mark = marks.get(p)
        if mark is None:
            continue
        if compacted or wp.compacting:
            wp.compacted_below = max(wp.compacted_below or 0, mark.high)
        wp.compacting = compacted


def holes_judged(parts: dict, plans: dict, notes: list) -> bool:
    """Whether the planned ranges ({partition: (settled, first, end)}) lie wholly where the topic never compacted;
    if not, no hole of this check is judged a phantom, and the note says why."""
    below = {p: parts[p].compacted_below for p, (_, first, _) in plans.items()
             if parts[p].compacted_below is not None and first < parts[p].compacted_below}
    if below:
        notes.append(COMPACTED_BEFORE_NOTE.format(
            below=", ".join(f"offset {offset} of partition {p}" for p, offset in sorted(below.items()))))
    return not below
