"""Keyed watches: the positions earlier checks settled, read back so that they take part in a check's ranking.

A key the producer wrote into two partitions (its partitioning changed) may have its newer record in a partition an
earlier check settled, and its older one in the partition this check settles. Judged alone, the older record would
report a row the consumer rightly replaced or deleted as lost. So both paths (watch_audit on PostgreSQL,
watch_spark) read back what earlier checks settled of every partition and keep, of it, only the records of the ids
and keys this check judges (watch_match.SETTLED_BEFORE): they rank in "the latest record of this id" as the
unsettled tail's records do, and are never judged themselves. Only an id that really has a newer record is spared.

The cost is bounded twice:
  - by time: only records at least as new as the oldest record this check judges can be newer than one of them,
    so each partition is read from Kafka's first offset of that timestamp (offsets_for_time: every record before
    it is older), normally a few positions before the partition's settled mark;
  - by size: at most SETTLED_READ_LIMIT positions per partition, the newest before its mark. A partition whose
    window is larger (a partition that ran far ahead of another) is cut, and the check's notes say where: a loss of
    a key also written in the part not read may be a record the consumer rightly replaced.
The records read are sent in chunks (watch_loader.COPY_CHUNK), and each chunk is filtered to the judged ids before
the next one is read: the check's tables grow by the matching records only.
"""
from psycopg2 import sql

from consumers.kafka import admin as kafka_admin
from consumers.reconciliation import watch_match

TABLE = "tally_watch_settled"   # the temporary table of a chunk read back (its relation: relations["settled"])

# Positions read back per partition and check: a bound on the extra reading one check may do (about what a check
# on Spark's threshold reads); the window of a partition with a normal lead is a handful of positions.
SETTLED_READ_LIMIT = 1_000_000
CUT_NOTE = ("keyed: the positions earlier checks settled were read back from {cuts} only ({limit} at most per "
            "partition): a loss of a key also written before them may be a record the consumer replaced")


def settled_marks(parts: dict, marks: dict) -> dict[int, tuple[int, int]]:
    """{partition: (first, end)}: the positions earlier checks settled that the log still holds, [first, end),
    before this check moves any mark."""
    spans = {}
    for p, wp in parts.items():
        mark = marks.get(p)
        if mark is None:
            continue
        first, end = max(wp.start_offset, mark.log_start), min(max(wp.settled_offset, mark.log_start), mark.high)
        if end > first:
            spans[p] = (first, end)
    return spans


class ReadBackFailed(RuntimeError):
    """Kafka could not say where to read back from: the check fails (ERR with this reason), nothing settles."""


def windows(watch, settled: dict[int, tuple[int, int]], oldest_ts: int | None,
            notes: list[str]) -> dict[int, tuple[int, int]]:
    """{partition: (start, end)} to read back: of each partition's settled positions, those from the first record
    at least `oldest_ts` old (the oldest record this check judges; None: it judges none), at most
    SETTLED_READ_LIMIT of them. A cut is noted in `notes`."""
    if oldest_ts is None or not settled:
        return {}
    try:
        newer_from = kafka_admin.offsets_for_time(watch.topic, sorted(settled), oldest_ts, cluster=watch.cluster)
    except Exception as exc:  # the range was read a moment ago: a leader moving, a broker refusing the lookup
        raise ReadBackFailed(f"Kafka: finding the settled records of {watch.topic} to read back: "
                             f"{type(exc).__name__}: {exc}") from exc
    spans, cuts = {}, []
    for p, (first, end) in sorted(settled.items()):
        start = newer_from.get(p)
        if start is None or start >= end:   # no record there is that new
            continue
        start = max(first, start)
        if end - start > SETTLED_READ_LIMIT:
            cuts.append(f"offset {end - SETTLED_READ_LIMIT} of partition {p} (not {start})")
            start = end - SETTLED_READ_LIMIT
        spans[p] = (start, end)
    if cuts:
        notes.append(CUT_NOTE.format(cuts=", ".join(cuts), limit=f"{SETTLED_READ_LIMIT:,}"))
    return spans


def read_back(cur, watch, settled: dict, notes: list, relations: dict, load) -> None:
    """PostgreSQL path: the records of the ids and keys judged now, read back from the positions earlier checks
    settled, added to `records` as tail: they rank, never judged. Sent a chunk at a time into a table of their own,
    from which each chunk's matching records move on before the next is read (watch_match.SETTLED_BEFORE).
    `load(reads, ends, relation, after_flush)` reads and COPYs records (watch_audit._load, whose check fails when
    Kafka does): handed in, so that this module never imports the audit."""
    cur.execute(watch_match.oldest_judged_sql(relations))
    spans = windows(watch, settled, cur.fetchone()[0], notes)
    if not spans:
        return
    cur.execute(sql.SQL("CREATE TEMP TABLE {} (LIKE {}) ON COMMIT DROP").format(
        sql.Identifier(TABLE), relations["records"]))
    move_on = sql.SQL("INSERT INTO {} {}; TRUNCATE {}").format(
        relations["records"], watch_match.settled_before_sql(relations), relations["settled"])
    # Every offset is at or past its 'end' (0): all tail.
    load(spans, dict.fromkeys(spans, 0), relations["settled"], lambda: cur.execute(move_on))
