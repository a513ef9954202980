"""The table a watch audits, as its operator names it: `table` or `schema.table`.

The rule, the same at every door (the command, watches.toml, the API, the form):
  - `table`: a table found on the database user's search_path, as PostgreSQL finds an unqualified name
    (in practice `public`), resolved again at each audit;
  - `schema.table`: that table of that schema, whatever the search_path says;
  - the text is split on its one dot: a name holding a dot, or more than one dot, is refused; so is a double
    quote anywhere (write names bare: no SQL quoting); each part is 1 to 63 characters, taken exactly as
    written (`Sales.Orders` is the schema "Sales", case kept, not folded to lower case).
The parts reach SQL only as psycopg2 `sql.Identifier(schema, table)`. Pipelines' sink tables follow their own,
stricter rule (consumers/engine/sink_names.py: plain names in TALLY_SINK_SCHEMA).
"""
from psycopg2 import sql

from consumers.engine.sink_names import MAX_IDENTIFIER

MAX_QUALIFIED = 2 * MAX_IDENTIFIER + 1   # schema '.' table
SYSTEM_SCHEMAS = ("information_schema",)
SYSTEM_SCHEMA_PREFIX = "pg_"             # pg_catalog, pg_toast, pg_temp_N


def split(name: str) -> tuple[str, ...]:
    """(table,) or (schema, table) of a name that passed `problem`."""
    return tuple(name.split(".", 1)) if "." in name else (name,)


def problem(name: str) -> str | None:
    """Why `name` is not a table name by the rule above, or None."""
    if '"' in name:
        return (f"write the table without quotes, as table or schema.table (names are taken exactly as written), "
                f"got {name!r}")
    if name.count(".") > 1:
        return (f"use table or schema.table: a name with more than one dot, or a dot inside a name, cannot be "
                f"watched, got {name!r}")
    parts = split(name)
    if not all(parts):
        return f"use table or schema.table, each part not empty, got {name!r}"
    if any(len(p) > MAX_IDENTIFIER for p in parts):
        return f"a schema or table name is at most {MAX_IDENTIFIER} characters (PostgreSQL's limit), got {name!r}"
    if len(parts) == 2 and (parts[0] in SYSTEM_SCHEMAS or parts[0].startswith(SYSTEM_SCHEMA_PREFIX)):
        return f"schema {parts[0]!r} is PostgreSQL's own: name the table the group writes"
    return None


def identifier(name: str) -> sql.Identifier:
    """The table as SQL: "table" or "schema"."table"."""
    return sql.Identifier(*split(name))
