"""The project's own tables (not the sinks) in raw SQL: their models name them, this module quotes them.

`table(Model)` is the one way raw SQL names a model's table: the model's `_meta.db_table` as a psycopg2
identifier, composed into statements with `psycopg2.sql`. So renaming a model or its table cannot leave a
statement behind, and tests/test_table_names.py keeps table names out of string literals.

The commit protocol (consumers/engine/commit.py) is the one exception: it also runs on Spark executors, where
Django is not set up and no model can be imported. The tables it writes are spelled once, below, and that test
holds each to its model's `_meta.db_table`.
"""
from psycopg2 import sql


def table(model) -> sql.Identifier:
    """The quoted name of a model's table, for sql.SQL(...).format(...)."""
    return sql.Identifier(model._meta.db_table)


# The commit protocol's tables, for Django-free callers only (see above); everyone else calls table(Model).
PIPELINE = sql.Identifier("consumers_pipeline")
PARTITION_OFFSET = sql.Identifier("consumers_partitionoffset")
DEAD_LETTER = sql.Identifier("consumers_deadletter")
BATCH_LEDGER = sql.Identifier("consumers_batchledger")
