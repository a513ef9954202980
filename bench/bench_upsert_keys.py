"""What grouping an upsert batch's keys by PostgreSQL's equality costs (consumers.engine.upsert.same_keys), per key
type, for a batch of `--keys` distinct keys as the JSON mapping gives them:

  bigint     Python's equality is PostgreSQL's: nothing to group
  uuid       canonical text: grouped in Python
  numeric    plain decimal text ("12.50"): grouped in Python by Decimal (1, 1.0 and 01.00 are one key)
  citext     grouped by PostgreSQL: one dense_rank query over the batch's keys
  values     the first form of that query (a VALUES row of casts a key, after a separate read check), kept here to
             show what the unnest form saves; it is the cost every uuid and numeric batch paid before they were
             grouped in Python

Each runs `--repeat` times; the best run counts. Nothing is written: the statements only read.

Usage (from the project root; needs PostgreSQL with the citext extension available):
  .venv/bin/python bench/bench_upsert_keys.py [--keys 20000] [--repeat 5]
"""
import argparse
import os
import random
import sys
import time
import uuid
from pathlib import Path

import psycopg2
from psycopg2 import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from consumers.engine import upsert  # noqa: E402 - after the project root is on the path

DSN = os.environ.get("BENCH_DSN", "dbname=postgres user=postgres host=127.0.0.1")


def values_form(cur, pg_type: str, keys: list[tuple]) -> None:
    """The first form: a read check, then one VALUES row of casts a key."""
    cast = sql.SQL("(%s::{})").format(sql.SQL(pg_type))
    cur.execute(sql.SQL("SELECT 1 FROM (VALUES {}) AS v").format(sql.SQL(", ").join([cast] * len(keys))),
                [key[0] for key in keys])
    row = sql.SQL("(%s::{}, %s)").format(sql.SQL(pg_type))
    cur.execute(sql.SQL("SELECT dense_rank() OVER (ORDER BY k), i FROM (VALUES {}) AS v (k, i) ORDER BY i").format(
        sql.SQL(", ").join([row] * len(keys))), [part for i, key in enumerate(keys) for part in (key[0], i)])
    cur.fetchall()


def best(repeat: int, run, *arguments) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run(*arguments)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    n = args.keys
    batches = {
        "bigint": [(rng.randrange(10**12),) for _ in range(n)],
        "uuid": [(str(uuid.UUID(int=rng.getrandbits(128))),) for _ in range(n)],
        "numeric": [(f"{rng.randrange(10**9)}.{rng.randrange(100):02d}",) for _ in range(n)],
        "citext": [(f"Customer-{rng.randrange(10**9)}",) for _ in range(n)],
    }
    conn = psycopg2.connect(DSN)
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS citext")  # rolled back at the end: nothing stays
    print(f"| {n:,} distinct keys, best of {args.repeat} | same_keys | µs a key | where they are grouped |")
    print("|---|---:|---:|---|")
    for pg_type, keys in batches.items():
        seconds = best(args.repeat, upsert.same_keys, cur, [pg_type], keys)
        where = "not needed" if pg_type == "bigint" else "PostgreSQL" if pg_type == "citext" else "Python"
        print(f"| {pg_type} | {seconds * 1000:.1f} ms | {seconds / n * 1e6:.2f} | {where} |")
    for pg_type in ("uuid", "numeric", "citext"):
        seconds = best(args.repeat, values_form, cur, pg_type, batches[pg_type])
        print(f"| {pg_type}, the first form (VALUES) | {seconds * 1000:.1f} ms | {seconds / n * 1e6:.2f} "
              "| PostgreSQL |")
    conn.rollback()
    conn.close()


if __name__ == "__main__":
    main()
