"""Sink tables: the transform's columns plus provenance, created and written with psycopg2.sql.

Every sink row carries `source_topic`, `source_partition`, `source_offset` (and `source_row` for
multi-row transforms), so any claim about loss or duplication can be checked row by row. Exactly-once
sinks have a unique key on the provenance; the other modes deliberately have none, so their duplicates
stay visible.
"""
import io

from psycopg2 import sql
from psycopg2.extensions import encodings

from consumers.engine.transforms import Transform

PROVENANCE = ("source_topic", "source_partition", "source_offset")
# A staging copy of a sink (LIKE) must fill what the sink fills for the columns a batch does not write: LIKE copies
# every NOT NULL, but an identity's sequence and a generated column's expression only when asked, so without them a
# table whose own id is an identity refused every staged row (null value in column "id").
LIKE_SINK = sql.SQL("INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING GENERATED")


def provenance_columns(transform: Transform) -> tuple[str, ...]:
    return PROVENANCE + (("source_row",) if transform.multi_row else ())


def insert_columns(transform: Transform) -> list[str]:
    return [name for name, _ in transform.columns] + list(provenance_columns(transform))


def ensure_sink_table(cursor, table: str, transform: Transform, exactly_once: bool) -> None:
    columns = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(pg_type))  # types come from code
               for name, pg_type in transform.columns]
    columns += [sql.SQL("source_topic text NOT NULL"), sql.SQL("source_partition integer NOT NULL"),
                sql.SQL("source_offset bigint NOT NULL")]
    if transform.multi_row:
        columns.append(sql.SQL("source_row integer NOT NULL DEFAULT 0"))
    columns.append(sql.SQL("written_at timestamptz NOT NULL DEFAULT clock_timestamp()"))
    cursor.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        sql.Identifier(table), sql.SQL(", ").join(columns)))
    key = sql.SQL(", ").join(sql.Identifier(c) for c in provenance_columns(transform))
    if exactly_once:
        cursor.execute(sql.SQL("CREATE UNIQUE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(f"{table}_provenance_key"), sql.Identifier(table), key))
    else:
        # Not unique on purpose (duplicates must be visible), but reconciliation still needs the index.
        cursor.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(f"{table}_provenance_idx"), sql.Identifier(table), key))


def drop_sink_table(cursor, table: str) -> None:
    cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def _copy_text(value) -> str:
    """One field in PostgreSQL COPY text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if any(c in text for c in "\\\t\n\r"):
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_buffer(rows) -> io.StringIO:
    """Rows (tuples of one width) as a COPY text buffer: the hot path of every batch.

    Fast path: format every row with one C-level "%s\t%s..." and accept the text only when it provably
    needs no escaping (the tab and newline counts match, no backslash or carriage return) and holds no
    None/True/False (which COPY spells differently). Otherwise format field by field."""
    rows = rows if isinstance(rows, list) else list(rows)
    if not rows:
        return io.StringIO()
    width = len(rows[0])
    try:
        text = "\n".join(map(("\t".join(["%s"] * width)).__mod__, rows)) + "\n"
    except TypeError:  # a row of another width
        text = None
    if (text is None or text.count("\t") != (width - 1) * len(rows) or text.count("\n") != len(rows)
            or "\\" in text or "\r" in text or "None" in text or "True" in text or "False" in text):
        text = "".join("\t".join(map(_copy_text, row)) + "\n" for row in rows)
    return io.StringIO(text)


class UnencodableValue(ValueError):
    """A value the connection's encoding cannot carry (a lone surrogate such as '\\ud800'): a data error of
    the record, found before anything is sent, like the errors PostgreSQL itself raises for bad values."""


def encoded_copy_buffer(connection, rows) -> io.BytesIO:
    """The COPY text of `rows`, encoded here rather than inside psycopg2: there an unencodable value
    cancels the COPY (SQLSTATE 57014, which says nothing about data); here it is UnencodableValue."""
    text = copy_buffer(rows).getvalue()
    try:
        return io.BytesIO(text.encode(encodings.get(connection.encoding, "utf-8")))
    except UnicodeEncodeError as exc:
        raise UnencodableValue(f"{exc.reason}: {exc.object[exc.start:exc.end]!r} cannot be encoded as "
                               f"{connection.encoding}") from None


COPY_CHUNK_BYTES = 1 << 20  # per call into libpq: fewer, larger calls than psycopg2's 8 KiB default


def copy_rows(cursor, table: str, columns: list[str], rows) -> None:
    """COPY rows (tuples in `columns` order) into the table: the fastest bulk path in PostgreSQL."""
    copy_text(cursor, table, columns, encoded_copy_buffer(cursor.connection, rows))


def copy_text(cursor, table: str, columns: list[str], text: io.BytesIO) -> None:
    """COPY an encoded COPY text buffer whose lines hold `columns`."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(c) for c in columns))
    cursor.copy_expert(statement.as_string(cursor), text, size=COPY_CHUNK_BYTES)


def verbatim_copy_text(values: list[bytes], offsets: list[int], topic: str, partition: int) -> bytes:
    """The COPY text of one partition's rows (value, source_topic, source_partition, source_offset) when each
    value is already its column's COPY text (Transform.verbatim): one C-level format per row, no per-record
    Python. Topic names are ASCII ([a-zA-Z0-9._-]), so their text is the same in every client encoding."""
    line = b"%s\t" + _copy_text(topic).encode("ascii") + b"\t" + str(partition).encode() + b"\t%d\n"
    return b"".join(map(line.__mod__, zip(values, offsets, strict=True)))


def insert_rows_skipping_existing(cursor, table: str, columns: list[str], rows, key_columns) -> int:
    """COPY into a transaction-local staging table, then insert what the sink does not have yet
    (ON CONFLICT on the provenance key DO NOTHING). Returns the number of rows inserted."""
    staging = f"staging_{table}"[:63]
    cursor.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} {}) ON COMMIT DELETE ROWS")
                   .format(sql.Identifier(staging), sql.Identifier(table), LIKE_SINK))
    copy_rows(cursor, staging, columns, rows)
    column_list = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    cursor.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO NOTHING").format(
        sql.Identifier(table), column_list, column_list, sql.Identifier(staging),
        sql.SQL(", ").join(sql.Identifier(c) for c in key_columns)))
    inserted = cursor.rowcount
    cursor.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(staging)))
    return inserted


def delete_rows_from(cursor, table: str, topic: str, partition: int, offset: int) -> int:
    """Delete the rows of one partition at or beyond `offset` (rewind with roll back sink)."""
    cursor.execute(sql.SQL("DELETE FROM {} WHERE source_topic = %s AND source_partition = %s "
                           "AND source_offset >= %s").format(sql.Identifier(table)), [topic, partition, offset])
    return cursor.rowcount


def count_rows_from(cursor, table: str, topic: str, partition: int, offset: int) -> int:
    """How many rows of one partition lie at or beyond `offset`: what a rollback to it would delete."""
    cursor.execute(sql.SQL("SELECT count(*) FROM {} WHERE source_topic = %s AND source_partition = %s "
                           "AND source_offset >= %s").format(sql.Identifier(table)), [topic, partition, offset])
    return cursor.fetchone()[0]
