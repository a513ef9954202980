"""Read a sink table row by row: the helpers behind the tests' exactness checks."""
from django.db import connection
from psycopg2 import sql


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
