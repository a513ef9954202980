"""A database role without privileges, for the tests of what Tally tells a database user who lacks a grant."""
import uuid
from contextlib import contextmanager

from django.db import connection
from psycopg2 import sql


def execute_composed(statement: sql.Composable, params=()) -> None:
    """Run a statement composed with psycopg2.sql on the test connection."""
    with connection.cursor() as cur:
        cur.execute(statement.as_string(cur.cursor), params)


@contextmanager
def new_role(prefix: str):
    """A new role, as its quoted name; dropped afterwards with every privilege granted to it meanwhile."""
    role = sql.Identifier(f"{prefix}_{uuid.uuid4().hex[:6]}")
    execute_composed(sql.SQL("CREATE ROLE {}").format(role))
    try:
        yield role
    finally:
        execute_composed(sql.SQL("DROP OWNED BY {}").format(role))   # revokes its privileges too
        execute_composed(sql.SQL("DROP ROLE {}").format(role))


@contextmanager
def acting_as(role: sql.Identifier):
    """The test connection's user switched to `role` inside the block."""
    execute_composed(sql.SQL("SET ROLE {}").format(role))
    try:
        yield
    finally:
        execute_composed(sql.SQL("RESET ROLE"))
