"""Columns of many rows of one model written in one statement: what a pass measured, row by primary key.

Django's bulk_update builds a CASE WHEN expression per row and column; at a watch pass's size (hundreds of rows,
nine columns) building them took more time than everything else in the pass. One UPDATE ... FROM (VALUES ...)
carries the same values, each cast to its column's type, and costs the database no more.
"""
from django.db import connection
from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine.tables import table

PAGE_SIZE = 500   # rows per statement


def update_columns(objects: list, fields: list[str]) -> None:
    """Write `fields` of every object (all of one model) to its row, in one statement per PAGE_SIZE rows."""
    if not objects:
        return
    meta = type(objects[0])._meta
    pk, columns = meta.pk, [meta.get_field(name) for name in fields]
    casts = sql.SQL(", ").join(sql.SQL("%s::") + sql.SQL(f.rel_db_type(connection) if f is pk else
                                                         f.db_type(connection)) for f in [pk, *columns])
    statement = sql.SQL("UPDATE {table} AS t SET {sets} FROM (VALUES %s) AS v ({names}) WHERE t.{pk} = v.{pk}").format(
        table=table(type(objects[0])), pk=sql.Identifier(pk.column),
        sets=sql.SQL(", ").join(sql.SQL("{0} = v.{0}").format(sql.Identifier(f.column)) for f in columns),
        names=sql.SQL(", ").join(sql.Identifier(f.column) for f in [pk, *columns]))
    rows = [[f.get_db_prep_save(getattr(obj, f.attname), connection) for f in [pk, *columns]] for obj in objects]
    with connection.cursor() as wrapper:
        cur = wrapper.cursor
        execute_values(cur, statement.as_string(cur), rows, template=sql.SQL("({})").format(casts).as_string(cur),
                       page_size=PAGE_SIZE)
