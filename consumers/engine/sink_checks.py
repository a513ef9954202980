"""What a sink table must offer a pipeline, read from PostgreSQL's catalog: the transform's columns and the
provenance columns, SELECT/INSERT/DELETE for the database user, and (exactly-once) a unique key on the
provenance. Used before a pipeline is created (consumers/operations/pipeline_setup.py, with the SQL that fixes each
problem) and by reconciliation, which turns a sink broken later (table dropped, privilege revoked) into ERR.
"""
from psycopg2 import sql

from consumers.engine import sinks
from consumers.engine.sink_names import MAX_IDENTIFIER
from consumers.engine.transforms import Transform


def quoted(cursor, table: str | tuple[str, ...]) -> str:
    """A table name (searched on the search_path) or (schema, table) parts, quoted as SQL."""
    return (sql.Identifier(*table) if isinstance(table, tuple) else sql.Identifier(table)).as_string(cursor)


def table_exists(cursor, table: str | tuple[str, ...]) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [quoted(cursor, table)])
    return bool(cursor.fetchone()[0])


def table_columns(cursor, table: str | tuple[str, ...]) -> dict | None:
    """{column: {"type": ..., "required": NOT NULL without default, "not_null": ...}} of a table in the search
    path (or of (schema, table): that schema's), or None."""
    cursor.execute("SELECT to_regclass(%s)", [quoted(cursor, table)])
    if cursor.fetchone()[0] is None:
        return None
    # An identity fills its column as a default does, though the catalog keeps it apart (attidentity, not atthasdef).
    cursor.execute("SELECT attname, format_type(atttypid, atttypmod), "
                   "attnotnull AND NOT atthasdef AND attidentity = '', attnotnull "
                   "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                   [quoted(cursor, table)])
    return {name: {"type": pg_type, "required": required, "not_null": not_null}
            for name, pg_type, required, not_null in cursor.fetchall()}


def _wanted_columns(transform: Transform) -> list[tuple[str, str]]:
    provenance = [("source_topic", "text"), ("source_partition", "integer"), ("source_offset", "bigint")]
    if transform.multi_row:
        provenance.append(("source_row", "integer"))
    return list(transform.columns) + provenance


def missing_column_fixes(cursor, table: str, transform: Transform, columns: dict) -> list[str]:
    fixes = []
    for name, pg_type in _wanted_columns(transform):
        if name not in columns:
            default = " NOT NULL DEFAULT 0" if name == "source_row" else ""
            fixes.append(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}{};").format(
                sql.Identifier(table), sql.Identifier(name), sql.SQL(pg_type), sql.SQL(default)).as_string(cursor))
    return fixes


def has_unique_key(cursor, table: str, columns) -> bool:
    """A unique index (or constraint) on exactly `columns`, in any order, without predicate or expression, and not
    DEFERRABLE (indimmediate): what INSERT ... ON CONFLICT (columns) needs (it refuses a deferrable arbiter)."""
    cursor.execute("SELECT array_agg(a.attname::text) FROM pg_index i "
                   "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                   "WHERE i.indrelid = %s::regclass AND i.indisunique AND i.indimmediate AND i.indpred IS NULL "
                   "AND i.indexprs IS NULL GROUP BY i.indexrelid", [quoted(cursor, table)])
    wanted = set(columns)
    return any(set(row[0]) == wanted for row in cursor.fetchall())


def has_unique_provenance_key(cursor, table: str, transform: Transform) -> bool:
    return has_unique_key(cursor, table, sinks.provenance_columns(transform))


def unique_key_sql(cursor, table: str, transform: Transform, columns=None, suffix: str = "provenance_key") -> str:
    """The statement that adds a unique constraint on `columns` (the provenance columns by default)."""
    columns = columns or sinks.provenance_columns(transform)
    return sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} UNIQUE ({});").format(
        sql.Identifier(table), sql.Identifier(f"{table}_{suffix}"[:MAX_IDENTIFIER]),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns)).as_string(cursor)


def grant_sql(cursor, table: str, update: bool = False) -> str:
    cursor.execute("SELECT current_user")
    return sql.SQL("GRANT SELECT, INSERT, DELETE" + (", UPDATE" if update else "") + " ON {} TO {};").format(
        sql.Identifier(table), sql.Identifier(cursor.fetchone()[0])).as_string(cursor)


def create_table_sql(cursor, table: str, transform: Transform, exactly_once: bool) -> str:
    body = [sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in transform.columns]
    body += [sql.SQL("source_topic text NOT NULL"), sql.SQL("source_partition integer NOT NULL"),
             sql.SQL("source_offset bigint NOT NULL")]
    if transform.multi_row:
        body.append(sql.SQL("source_row integer NOT NULL DEFAULT 0"))
    if exactly_once:
        body.append(sql.SQL("UNIQUE ({})").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in sinks.provenance_columns(transform))))
    return sql.SQL("CREATE TABLE {} ({});").format(sql.Identifier(table), sql.SQL(", ").join(body)).as_string(cursor)


def may_read(cursor, table: str | tuple[str, ...]) -> bool:
    """SELECT on the table (a watched team's table: Tally only reads it) for the database user."""
    cursor.execute("SELECT has_table_privilege(current_user, %s::regclass, 'SELECT')", [quoted(cursor, table)])
    return cursor.fetchone()[0]


def read_refused(table: str) -> str:
    """What a database user without SELECT on a watched table is told, wherever it is found out."""
    return f"the database user may not read {table!r}: GRANT SELECT ON it to Tally's database user"


def has_privileges(cursor, table: str, update: bool = False) -> bool:
    """SELECT, INSERT and DELETE (and UPDATE, for an upsert pipeline) for the database user."""
    cursor.execute("SELECT has_table_privilege(current_user, %s::regclass, %s)",
                   [quoted(cursor, table), "SELECT,INSERT,DELETE" + (",UPDATE" if update else "")])
    return cursor.fetchone()[0]


def problem(cursor, table: str, transform: Transform, exactly_once: bool, upsert_key=()) -> str:
    """Why a pipeline cannot write its sink now ("" when it can): missing table, columns, key or privilege.
    An upsert pipeline needs a unique key on its upsert key instead of on the provenance."""
    columns = table_columns(cursor, table)
    if columns is None:
        return f"sink table {table!r} does not exist"
    missing = [name for name, _ in _wanted_columns(transform) if name not in columns]
    if missing:
        return f"sink table {table!r} lacks column(s) {', '.join(missing)}"
    if upsert_key:
        if not has_unique_key(cursor, table, upsert_key):
            return f"sink table {table!r} has no unique key on the upsert key ({', '.join(upsert_key)})"
    elif exactly_once and not has_unique_provenance_key(cursor, table, transform):
        return f"sink table {table!r} has no unique key on the provenance columns"
    if not has_privileges(cursor, table, update=bool(upsert_key)):
        return f"the database user may not select, insert and delete in sink table {table!r}"
    return ""
