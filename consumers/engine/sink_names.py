"""Which tables a pipeline may write: plain names in the allowed schema (`TALLY_SINK_SCHEMA`, default public),
never a table of Tally, Django, an installed app or PostgreSQL. Refused by name, before any catalog lookup:
`auth_user` once passed only because it lacked the provenance columns, and `public.auth_user` was created
as a new table whose name held a dot."""
import re

from django.apps import apps
from django.conf import settings

MAX_IDENTIFIER = 63  # PostgreSQL truncates longer identifiers silently; refuse them instead
# A plain identifier: no schema, no dot, no quote, so the name means one table in the allowed schema.
PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
SYSTEM_PREFIXES = ("pg_", "django_", "sql_")


def owner_of(table: str) -> str | None:
    """Who owns a table of that name (an installed app's model, or PostgreSQL and Django), or None."""
    name = table.lower()
    models = apps.get_models(include_auto_created=True)
    for model in models:
        if model._meta.db_table.lower() == name:
            return f"the {model._meta.app_config.verbose_name} app ({model._meta.label})"
    # The first word of an app's table names is its namespace (auth_, axes_, consumers_, ...): a new table there
    # would sit among that app's own, and a later version of the app may claim it.
    for model in models:
        prefix = model._meta.db_table.lower().split("_")[0] + "_"
        if name.startswith(prefix):
            return f"the {model._meta.app_config.verbose_name} app (its tables start with {prefix})"
    if name.startswith(SYSTEM_PREFIXES):
        return "PostgreSQL or Django"
    return None


def name_problem(table: str) -> str | None:
    """Why `table` cannot be a sink table by its name alone, or None."""
    schema = settings.TALLY_SINK_SCHEMA
    if len(table) > MAX_IDENTIFIER:
        return f"at most {MAX_IDENTIFIER} characters (PostgreSQL's limit), got {len(table)}"
    if not PLAIN_NAME.fullmatch(table):
        return (f"use a plain table name (letters, digits and '_', no schema, dot or quote): sink tables live in "
                f"schema {schema!r}")
    owner = owner_of(table)
    if owner:
        return f"{table!r} is a table name of {owner}: choose another name"
    return None


def schema_problem(cursor, table: str) -> str | None:
    """Why `table` would not be a table of the allowed schema in this database (it resolves to one elsewhere on
    the search path, or new tables are not created there), or None. `cursor` is a DB-API cursor."""
    schema = settings.TALLY_SINK_SCHEMA
    cursor.execute("SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE c.oid = to_regclass(quote_ident(%s))", [table])
    found = cursor.fetchone()
    if found is not None and found[0] != schema:
        return f"{table!r} resolves to {found[0]}.{table}, outside the allowed schema {schema!r}"
    cursor.execute("SELECT current_schema()")
    current = cursor.fetchone()[0]
    if found is None and current != schema:
        return (f"new tables are created in schema {current!r}, not in the allowed schema {schema!r}: set the "
                "database user's search_path, or TALLY_SINK_SCHEMA")
    return None
