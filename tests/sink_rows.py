"""Make a sink table of a test's own columns; read a sink table row by row: the helpers behind the tests'
exactness checks."""
import contextlib
import uuid

from django.db import connection
from psycopg2 import sql

from tests.conftest import drop_sink_tables

PROVENANCE = ("source_topic text NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, "
              "UNIQUE (source_topic, source_partition, source_offset)")


@contextlib.contextmanager
def made_sink_table(prefix: str, columns: str):
    """Yields the name of a new table `<prefix>_<random>` of these columns (SQL) and the provenance columns a sink
    table has; the table is dropped at the end."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL(f"CREATE TABLE {{}} ({columns}, {PROVENANCE})").format(sql.Identifier(name))
                       .as_string(cursor.cursor))
    try:
        yield name
    finally:
        drop_sink_tables([name])


def provenance_rows(table: str) -> list[tuple[int, int, int]]:
    """(partition, offset, id) of every row of the sink table, sorted; duplicates stay visible."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT source_partition, source_offset, id FROM {} ORDER BY 1, 2, 3")
                       .format(sql.Identifier(table)).as_string(cursor.cursor))
        return [tuple(row) for row in cursor.fetchall()]


def sink_offsets(table: str) -> list[int]:
    """source_offset of every row of the sink table, in order; duplicates stay visible."""
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT source_offset FROM {} ORDER BY source_offset")
                       .format(sql.Identifier(table)).as_string(cursor.cursor))
        return [row[0] for row in cursor.fetchall()]
