"""Reading a watch's findings back, as far as the reader shows them and no further.

A watch of a consumer that loses records at every check (every 30 s by default) stores a range with findings each
time: about 2,880 a day, kept for TALLY_RETAIN_WATCH_HISTORY_DAYS. Its page, its API, each check's report and each
alert pass show the first OFFSETS_LISTED offsets or MAX_RANGES_PER_PARTITION ranges; reading every range to
show those took seconds per call after a month (docs/benchmarks.md, "A watch's findings after a long history").
Both readers here stop at what they show, reading ranges in partition and offset order from watch_range_idx.
"""
from django.db import connection
from django.db.models import Q
from psycopg2 import sql

from consumers.models import OFFSETS_LISTED, Watch, WatchPartition, WatchRange

LISTING_CHUNK = 50     # ranges read at a time while listing offsets: most watches need one read


def listed_offsets(watch: Watch, limit: int = OFFSETS_LISTED, parts=None) -> tuple[list, list]:
    """The first `limit` lost and duplicated records of the watch, as {partition, offset}, in offset order.
    `parts`: the watch's WatchPartitions when already read; a kind that none of their totals counts is not read."""
    parts = list(WatchPartition.objects.filter(watch=watch)) if parts is None else parts
    return tuple(_first_offsets(watch, kind, limit) if any(getattr(wp, kind) for wp in parts) else []
                 for kind in ("lost", "duplicated"))


def _first_offsets(watch: Watch, kind: str, limit: int) -> list[dict]:
    ranges = (WatchRange.objects.filter(watch=watch, **{f"{kind}__gt": 0}).order_by("partition", "start")
              .values_list("partition", "start", f"{kind}_offsets"))
    listed, after = [], Q()
    while len(listed) < limit:
        chunk = list(ranges.filter(after)[:LISTING_CHUNK])
        for partition, _, offsets in chunk:
            # duplicated_offsets holds [offset, extra rows] pairs
            listed += [{"partition": partition, "offset": o if kind == "lost" else o[0]}
                       for o in offsets[:limit - len(listed)]]
        if len(chunk) < LISTING_CHUNK:
            break
        partition, start, _ = chunk[-1]
        after = Q(partition__gt=partition) | Q(partition=partition, start__gt=start)
    return listed


def first_finding_ranges(watch_ids: list[int], per_partition: int) -> dict[int, list[WatchRange]]:
    """{watch id: ranges}: of each partition of the watches, its first `per_partition` ranges with a finding, in
    partition and offset order. One query for any number of watches: each partition is read from watch_range_idx
    up to that many rows."""
    query = sql.SQL(
        "SELECT found.* FROM {partitions} wp CROSS JOIN LATERAL ("
        " SELECT * FROM {ranges} r WHERE r.watch_id = wp.watch_id AND r.partition = wp.partition"
        " AND (r.lost > 0 OR r.duplicated > 0 OR r.phantom > 0) ORDER BY r.start LIMIT %s) found"
        " WHERE wp.watch_id = ANY(%s) ORDER BY found.watch_id, found.partition, found.start").format(
        partitions=sql.Identifier(WatchPartition._meta.db_table), ranges=sql.Identifier(WatchRange._meta.db_table))
    with connection.cursor() as cursor:
        text = query.as_string(cursor.cursor)
    found: dict[int, list[WatchRange]] = {}
    for r in WatchRange.objects.raw(text, [per_partition, list(watch_ids)]):
        found.setdefault(r.watch_id, []).append(r)
    return found
