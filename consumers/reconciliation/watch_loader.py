"""The records a watch's check reads from Kafka, sent to PostgreSQL: the check's temporary tables (created and
dropped in one statement each), and the Loader that turns records into their lines and sends them with COPY, a
chunk at a time, so a range of millions of records costs bounded memory. watch_audit reads and matches; this module
only loads."""
import io

from psycopg2 import sql

from consumers.engine import record_ids
from consumers.models import Watch
from consumers.reconciliation import watch_settled

RECORDS, WRITTEN, RANGES = "tally_watch_records", "tally_watch_written", "tally_watch_ranges"
FOUND, SETTLED = "tally_watch_found", watch_settled.TABLE
TEMPORARY = (RECORDS, WRITTEN, RANGES, FOUND, SETTLED)
RELATIONS = {"records": sql.SQL("pg_temp.") + sql.Identifier(RECORDS),
             "written": sql.SQL("pg_temp.") + sql.Identifier(WRITTEN),
             "ranges": sql.SQL("pg_temp.") + sql.Identifier(RANGES),
             "found": sql.SQL("pg_temp.") + sql.Identifier(FOUND),
             "settled": sql.SQL("pg_temp.") + sql.Identifier(SETTLED)}
# One statement for all of them: a pass audits many watches, each round trip counts.
DROP_TEMPORARY = sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(
    sql.SQL("pg_temp.") + sql.Identifier(name) for name in TEMPORARY))
# Lines of COPY buffered before they are sent: bounded memory for a range of millions of records.
COPY_CHUNK = 100_000


class Loader:
    """Turns records into lines of the temporary table and sends them with COPY, a chunk at a time."""

    def __init__(self, cursor, watch: Watch, id_type: str | None, ends: dict[int, int], relation=None,
                 after_flush=None):
        self.cursor, self.ends, self.after_flush = cursor, ends, after_flush   # after_flush: after each chunk sent
        self.relation = RELATIONS["records"] if relation is None else relation
        self.by_offset = id_type is None
        self.spec = None if self.by_offset else record_ids.parse_spec(watch.record_id)
        self.ignores = [record_ids.parse_ignore(text) for text in watch.ignore]
        self.normalise = record_ids.normaliser(id_type)
        self.keys = record_ids.names_by_key(self.spec, watch.keyed)   # the key, for tombstones (TOMBSTONE_IDS)
        self.counts: dict[int, dict[str, int]] = {}
        self.buffer, self.lines = io.StringIO(), 0

    def add(self, partition: int, records) -> None:
        counts = self.counts.setdefault(partition, {"records": 0, "ignored": 0, "unreadable": 0})
        end, write = self.ends[partition], self.buffer.write
        if not self.by_offset and not self.ignores and records and records[-1].offset < end:
            self._add_ids(partition, records, counts)
        else:
            self._add_any(partition, records, counts, end, write)
        if self.lines >= COPY_CHUNK:
            self.flush()

    def _add_ids(self, partition: int, records, counts: dict) -> None:
        """The common case (ids, no ignore spec, no record of the tail), with one branch less per record and
        the lines joined once: 1.2-2x the general path."""
        extract, normalise, prefix, keys = self.spec.extract, self.normalise, f"{partition}\t", self.keys
        lines, unreadable = [], 0
        for r in records:
            rid = normalise(extract(r.key, r.value))
            if rid is None:
                unreadable += 1
            lines.append(f"{prefix}{r.offset}\t{copy_text(rid)}\tt\t{'t' if r.value is None else 'f'}\t"
                         f"{r.timestamp}\tf\t{copy_text(record_ids.key_text(r.key) if keys else None)}\n")
        self.buffer.write("".join(lines))
        counts["records"] += len(records)
        counts["unreadable"] += unreadable
        self.lines += len(records)

    def _add_any(self, partition: int, records, counts: dict, end: int, write) -> None:
        for r in records:
            tail = r.offset >= end
            rid, ignored = record_ids.derive(self.spec, self.ignores, self.normalise, r.key, r.value)
            if not tail:
                counts["records"] += 1
                if ignored:
                    counts["ignored"] += 1
                elif rid is None and not self.by_offset:
                    counts["unreadable"] += 1
            key = copy_text(record_ids.key_text(r.key) if self.keys else None)
            write(f"{partition}\t{r.offset}\t{copy_text(rid)}\t{'f' if ignored else 't'}\t"
                  f"{'t' if r.value is None else 'f'}\t{r.timestamp}\t{'t' if tail else 'f'}\t{key}\n")
            self.lines += 1

    def flush(self) -> None:
        if self.lines:
            self.buffer.seek(0)
            self.cursor.copy_expert(sql.SQL("COPY {} FROM STDIN").format(self.relation).as_string(self.cursor),
                                    self.buffer)
            self.buffer, self.lines = io.StringIO(), 0
            if self.after_flush:
                self.after_flush()


def create_temporary_tables(cur, id_type: str | None, plans: dict) -> None:
    cur.execute(DROP_TEMPORARY)   # a caller's open transaction may hold a previous check's
    rid_type = sql.SQL(record_ids.column_type(id_type)) if id_type else sql.SQL("text")
    cur.execute(sql.SQL('CREATE TEMP TABLE {} (partition integer NOT NULL, "offset" bigint NOT NULL, rid {}, '
                        "expected boolean NOT NULL, tomb boolean NOT NULL, ts bigint, tail boolean NOT NULL, k text) "
                        "ON COMMIT DROP").format(sql.Identifier(RECORDS), rid_type))
    cur.execute(sql.SQL('CREATE TEMP TABLE {} (partition integer, start bigint, "end" bigint) ON COMMIT DROP').format(
        sql.Identifier(RANGES)))
    values = [(p, first, end) for p, (_, first, end) in plans.items()]
    cur.executemany(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(RELATIONS["ranges"]), values)


def copy_text(value: str | None) -> str:
    if value is None:
        return "\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value
