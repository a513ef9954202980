"""Upsert pipelines (`--upsert-key COL[,COL]`): one row per key, kept current, in the batch's transaction.

Called by the commit protocol (consumers/engine/commit.py) inside its one transaction, so a record is applied
exactly once with the offsets, as in append mode:
  1. `last_per_key`: within a batch the last record per key wins, tombstones included; the earlier ones are
     superseded before anything is written (INSERT ... ON CONFLICT cannot touch one row twice in a statement,
     and writing them would be wasted work). Keys are equal as PostgreSQL's equality says (`same_keys`): 'Ann'
     and 'ANN' are one citext key, 'a' and 'a  ' one char(n) key, 1 and 1.0 one numeric key. A last record the
     database then refuses (a CHECK) is a dead letter, and its key takes its latest record the database takes
     (consumers/engine/commit.py), as it would record by record.
  2. `write_rows`: COPY the rows into a transaction-local staging table, then INSERT INTO the sink (in key
     order) ... ON CONFLICT (key) DO UPDATE every column -- the key's spelling ('ANN' after 'ann') and the
     provenance columns too, so the row is the last record's however records fall into batches, and always
     says which record wrote it.
  3. `delete_keys`: the keys whose last record is a tombstone (`--delete-on-tombstone`) lose their row.
Keys are judged per partition order: a keyed topic keeps each key in one partition, as Kafka's partitioner
does; a key found in two partitions of one batch takes the record of the higher partition. The Spark engine
commits a micro-batch's partitions in separate tasks, so there the slice committed last wins: making it follow
this rule would commit every upsert micro-batch in one task, giving up Spark's parallel writes for a case that
stays timing-dependent across batches on both engines (a poll's or micro-batch's bounds fall where they fall).
"""
import re
from decimal import Decimal
from typing import NamedTuple

from psycopg2 import sql
from psycopg2.extras import execute_values

from consumers.engine import poison, sinks

_LENGTH = re.compile(r"\([0-9]+\)$")  # character varying(20) is compared as character varying
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PLAIN_DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def _of_type(kind: type):
    return lambda value: value if type(value) is kind else None


def _uuid_key(value):
    # The JSON mapping writes a uuid as its canonical text, in which equal uuids are one string.
    return value if type(value) is str and _CANONICAL_UUID.fullmatch(value) else None


def _numeric_key(value):
    # 1, 1.0 and 01.00 are one numeric, and one Decimal (equal, and hashed alike, as an int is).
    if type(value) is int:
        return value
    return Decimal(value) if type(value) is str and _PLAIN_DECIMAL.fullmatch(value) else None


# Key types whose values Python can compare as PostgreSQL does: each maps a key value to what to compare it by, or
# to None when it cannot say (another spelling, another Python type), and then PostgreSQL groups the batch's keys.
# Any other type (citext, char(n), numeric(p,s), timestamptz, a domain, text of a nondeterministic collation --
# "text COLLATE ...") is always grouped by PostgreSQL.
PYTHON_KEYS = {"smallint": _of_type(int), "integer": _of_type(int), "bigint": _of_type(int), "text": _of_type(str),
               "character varying": _of_type(str), "uuid": _uuid_key, "numeric": _numeric_key}


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
    judged = _judged_in_python(types, keys)
    if judged is not None:
        return None if judged == keys else _firsts(keys, judged)
    distinct = list(dict.fromkeys(keys))
    if len(distinct) < 2:
        return {key: key for key in distinct}
    ranked: list[list[int]] = []
    refused = poison.find_poison(cur, lambda some: ranked.append(_ranks(cur, types, some)), [[key] for key in distinct])
    if not refused:
        return _firsts(distinct, ranked[0])
    # The ranks of the halves bisection wrote are not comparable: the readable keys are ranked again.
    same = {key: key for key in distinct}
    readable = [key for index, key in enumerate(distinct) if index not in refused]
    if len(readable) > 1:
        same.update(_firsts(readable, _ranks(cur, types, readable)))
    return same


def _judged_in_python(types: list[str], keys: list[tuple]) -> list[tuple] | None:
    """What Python compares each key by, or None when PostgreSQL must judge one of them."""
    judges = [PYTHON_KEYS.get(_LENGTH.sub("", pg_type)) for pg_type in types]
    if None in judges:
        return None
    if len(judges) == 1:  # the common case, kept cheap: a batch has tens of thousands of keys
        judge = judges[0]
        judged = [(judge(value),) for value, in keys]
    else:
        judged = [tuple(judge(value) for judge, value in zip(judges, key, strict=True)) for key in keys]
    return None if any(None in values for values in judged) else judged


def _firsts(keys: list[tuple], groups: list) -> dict[tuple, tuple]:
    """{key: the first key of its group}, where groups[i] names the group of keys[i]."""
    first: dict = {}
    return {key: first.setdefault(group, key) for key, group in zip(keys, groups, strict=True)}


def _ranks(cur, types: list[str], keys: list[tuple]) -> list[int]:
    """Each key's dense rank in its types' own order, as PostgreSQL reads the key (equal keys share a rank); a
    key PostgreSQL cannot read as its types raises a data error. One text array a key column: a batch's keys are
    one parameter each, not a row of casts each."""
    names = [sql.Identifier(f"k{i}") for i in range(len(types))]
    cur.execute(sql.SQL("SELECT dense_rank() OVER (ORDER BY {}) FROM unnest({}) WITH ORDINALITY AS v ({}, i) "
                        "ORDER BY i").format(
        sql.SQL(", ").join(sql.SQL("{}::{}").format(name, sql.SQL(t)) for name, t in zip(names, types, strict=True)),
        sql.SQL(", ").join([sql.SQL("%s::text[]")] * len(types)), sql.SQL(", ").join(names)),
        [[_as_text(key[i]) for key in keys] for i in range(len(types))])
    return [rank for rank, in cur.fetchall()]


def _as_text(value) -> str | None:
    """A key value as PostgreSQL's input text of its type."""
    if value is None:
        return None
    if isinstance(value, bytes | memoryview):
        return "\\x" + bytes(value).hex()
    return str(value)


def write_rows(cur, table: str, columns: list[str], upsert_key: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert or update each row in place, on the sink's unique key on `upsert_key`."""
    staging = f"upsert_{table}"[:63]
    cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} {}) ON COMMIT DELETE ROWS")
                .format(sql.Identifier(staging), sql.Identifier(table), sinks.LIKE_SINK))
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
