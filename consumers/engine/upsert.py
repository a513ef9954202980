"""Upsert pipelines (`--upsert-key COL[,COL]`): one row per key, kept current, in the batch's transaction.

Called by the commit protocol (consumers/engine/commit.py) inside its one transaction, so a record is applied
exactly once with the offsets, as in append mode:
  1. `last_per_key`: within a batch the last record per key wins, tombstones included; the earlier ones are
     superseded before anything is written (INSERT ... ON CONFLICT cannot touch one row twice in a statement,
     and writing them would be wasted work). Keys are equal as PostgreSQL's equality says (`same_keys`): 'Ann'
     and 'ANN' are one citext key, 'a' and 'a  ' one char(n) key, 1 and 1.0 one numeric key.
  2. `write_rows`: COPY the rows into a transaction-local staging table, then INSERT INTO the sink (in key
     order) ... ON CONFLICT (key) DO UPDATE every column -- the key's spelling ('ANN' after 'ann') and the
     provenance columns too, so the row is the last record's however records fall into batches, and always
     says which record wrote it.
  3. `delete_keys`: the keys whose last record is a tombstone (`--delete-on-tombstone`) lose their row.
Keys are judged per partition order: a keyed topic keeps each key in one partition, as Kafka's partitioner
does; a key found in two partitions of one batch takes the record of the higher partition.
"""
import re
from typing import NamedTuple

from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine import poison, sinks

# Key types whose values, as the JSON mapping's converters give them, are equal in Python exactly when they are in
# PostgreSQL (with the same Python type). Keys of any other type (citext, char(n), numeric, timestamptz, a domain,
# text of a nondeterministic collation -- "text COLLATE ...", ...) are grouped by PostgreSQL itself.
PYTHON_EQUAL_TYPES = {"smallint": int, "integer": int, "bigint": int, "text": str, "character varying": str}
_LENGTH = re.compile(r"\([0-9]+\)$")  # character varying(20) is compared as character varying


class Delete(NamedTuple):
    """A tombstone that deletes its key's row: the key columns' values and the record's provenance."""

    key: tuple
    topic: str
    partition: int
    offset: int


def key_indexes(transform, upsert_key: tuple[str, ...]) -> list[int]:
    names = [name for name, _ in transform.columns]
    return [names.index(column) for column in upsert_key]


def key_types(transform, upsert_key: tuple[str, ...]) -> list[str]:
    """The key columns' PostgreSQL types, as the catalog names them."""
    types = dict(transform.columns)
    return [types[column] for column in upsert_key]


def last_per_key(rows: list[tuple], deletes: list[Delete], indexes: list[int],
                 same: dict[tuple, tuple] | None = None) -> tuple[list[tuple], list[Delete]]:
    """The rows and deletes that remain once each key keeps only its last record. Rows end with (topic,
    partition, offset) and come in (partition, offset) order. `same` maps each key tuple to the one that stands
    for every key PostgreSQL holds equal to it (`same_keys`); None when Python's equality is PostgreSQL's."""
    if same is not None:
        latest = {same[tuple(row[i] for i in indexes)]: row for row in rows}
    elif len(indexes) == 1:
        i = indexes[0]
        latest = {row[i]: row for row in rows}
    else:
        latest = {tuple(row[i] for i in indexes): row for row in rows}
    if not deletes and len(latest) == len(rows):
        return rows, []
    single = len(indexes) == 1 and same is None
    for delete in deletes:
        key = same[delete.key] if same is not None else delete.key[0] if single else delete.key
        current = latest.get(key)
        if current is None or (current[-2], current[-1]) < (delete.partition, delete.offset):
            latest[key] = delete
    kept = [entry for entry in latest.values() if type(entry) is not Delete]
    return kept, [entry for entry in latest.values() if type(entry) is Delete]


def same_keys(cur, types: list[str], keys: list[tuple]) -> dict[tuple, tuple] | None:
    """{key: the first of `keys` that PostgreSQL holds equal to it}, by the key types' own equality (the one their
    unique index uses); None when Python's equality is PostgreSQL's for these keys. A key PostgreSQL cannot read
    as its type stands for itself: writing it makes its record a dead letter."""
    if all(PYTHON_EQUAL_TYPES.get(_LENGTH.sub("", pg_type)) is type(key[i]) for key in keys
           for i, pg_type in enumerate(types)):
        return None
    distinct = list(dict.fromkeys(keys))
    same = {key: key for key in distinct}
    if len(distinct) < 2:
        return same
    cells = sql.SQL(", ").join(sql.SQL("%s::{}").format(sql.SQL(t)) for t in types)  # types read from the catalog
    casts = sql.SQL("({})").format(cells)
    refused = poison.find_poison(cur, lambda some: _read_keys(cur, casts, some), [[key] for key in distinct])
    readable = [key for index, key in enumerate(distinct) if index not in refused]
    if len(readable) < 2:
        return same
    # Equal keys are peers in their own order: one rank each group.
    cur.execute(sql.SQL("SELECT dense_rank() OVER (ORDER BY {0}), i FROM (VALUES {1}) AS v ({0}, i) ORDER BY i").format(
        sql.SQL(", ").join(sql.Identifier(f"k{i}") for i in range(len(types))),
        sql.SQL(", ").join([sql.SQL("({}, %s)").format(cells)] * len(readable))),
        [part for index, key in enumerate(readable) for part in (*key, index)])
    first: dict[int, tuple] = {}
    for rank, index in cur.fetchall():
        same[readable[index]] = first.setdefault(rank, readable[index])
    return same


def _read_keys(cur, casts, keys: list[tuple]) -> None:
    """PostgreSQL reads each key as the key's types, or refuses one (a data error)."""
    cur.execute(sql.SQL("SELECT 1 FROM (VALUES {}) AS v").format(sql.SQL(", ").join([casts] * len(keys))),
                [part for key in keys for part in key])


def write_rows(cur, table: str, columns: list[str], upsert_key: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert or update each row in place, on the sink's unique key on `upsert_key`."""
    staging = f"upsert_{table}"[:63]
    cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
                .format(sql.Identifier(staging), sql.Identifier(table)))
    sinks.copy_rows(cur, staging, columns, rows)
    column_list = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    # The key columns too: keys PostgreSQL holds equal may be spelled differently ('ann', 'ANN' in citext), and the
    # row takes the last record's spelling whether the records came in one batch or several. An unchanged key
    # (every int key) is the same bytes, so the update stays HOT.
    updates = columns
    key_list = sql.SQL(", ").join(sql.Identifier(c) for c in upsert_key)
    # In key order: the unique index is walked from one end to the other instead of at random, which measured
    # 25-45 % faster on a table of 1,000,000 keys larger than shared_buffers (docs/benchmarks.md).
    cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY {} ON CONFLICT ({}) DO UPDATE SET {}").format(
        sql.Identifier(table), column_list, column_list, sql.Identifier(staging), key_list, key_list,
        sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates)))
    cur.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(staging)))


def delete_keys(cur, table: str, key_types: list[tuple[str, str]], deletes: list[Delete]) -> int:
    """Delete the rows of these keys; `key_types` are the key's (column, PostgreSQL type) from the catalog."""
    if not deletes:
        return 0
    names = [sql.Identifier(name) for name, _ in key_types]
    template = sql.SQL("({})").format(sql.SQL(", ").join(
        sql.SQL("%s::{}").format(sql.SQL(pg_type)) for _, pg_type in key_types))  # types read from the catalog
    statement = sql.SQL("DELETE FROM {} AS s USING (VALUES %s) AS v ({}) WHERE {}").format(
        sql.Identifier(table), sql.SQL(", ").join(names),
        sql.SQL(" AND ").join(sql.SQL("s.{0} = v.{0}").format(n) for n in names))
    execute_values(cur, statement.as_string(cur), [d.key for d in deletes], template=template.as_string(cur),
                   page_size=1000)
    return cur.rowcount
