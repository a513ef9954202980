"""Encoding and COPYing one batch of sink rows, three ways, into the same real PostgreSQL table:

  text     consumers.engine.sinks.copy_rows: the project's COPY text encoder + psycopg2 copy_expert
  csv      the csv module into a buffer + copy_expert with COPY ... (FORMAT csv)
  binary   pgcopy.CopyManager: binary COPY (needs the table's column types, read once per table)

Rows look like the engine's: (int value, source_topic, source_partition, source_offset), and a second shape
with a JSON text column. Each way runs `--repeat` times per shape inside a transaction that is rolled back;
the best time counts (the machine is shared, the best run is the least disturbed one).

Usage (from the project root; uses database tally_bench, creates and drops its tables):
  .venv/bin/python bench/bench_copy.py [--rows 20000] [--repeat 7]
"""
import argparse
import csv
import io
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally_bench")


def rows_int(n):
    return [(i, "nums", i % 3, i) for i in range(n)]


def rows_json(n):
    return [(json.dumps({"id": i, "name": f"user {i}", "tags": ["a", "b"]}), "events", i % 3, i) for i in range(n)]


SHAPES = {"int": ("bigint", rows_int), "json": ("text", rows_json)}
COLUMNS = ["value", "source_topic", "source_partition", "source_offset"]


def via_text(cur, table, rows):
    from consumers.engine.sinks import copy_rows

    copy_rows(cur, table, COLUMNS, rows)


def via_csv(cur, table, rows):
    from psycopg2 import sql

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    buffer.seek(0)
    statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, COLUMNS)))
    cur.copy_expert(statement.as_string(cur), buffer, size=1 << 16)


_managers = {}


def via_binary(cur, table, rows):
    from pgcopy import CopyManager

    manager = _managers.get(table)
    if manager is None:   # reads the column types from the catalog: once per table, as an engine would
        manager = _managers[table] = CopyManager(cur.connection, table, COLUMNS)
    manager.copy(rows)


WAYS = {"text": via_text, "csv": via_csv, "binary": via_binary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import psycopg2
    from psycopg2 import sql

    url = os.environ["DATABASE_URL"]
    admin = psycopg2.connect(url.rsplit("/", 1)[0] + "/postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'tally_bench'")
        if not cur.fetchone():
            cur.execute("CREATE DATABASE tally_bench")
    admin.close()
    conn = psycopg2.connect(url)
    print(f"{platform.node()} · {os.cpu_count()} cores · Python {platform.python_version()} · "
          f"PostgreSQL {conn.server_version} · {args.rows} rows per batch, best of {args.repeat}")
    with conn.cursor() as cur:
        for shape, (pg_type, _) in SHAPES.items():
            table = f"bench_copy_{shape}"
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
            cur.execute(sql.SQL("CREATE TABLE {} (value {}, source_topic text NOT NULL, source_partition integer "
                                "NOT NULL, source_offset bigint NOT NULL)").format(sql.Identifier(table),
                                                                                   sql.SQL(pg_type)))
        conn.commit()
    print("| rows | way | best batch (ms) | rows/s |")
    print("|---|---|---|---|")
    try:
        for shape, (_, make) in SHAPES.items():
            rows, table = make(args.rows), f"bench_copy_{shape}"
            for way, write in WAYS.items():
                best = float("inf")
                for _ in range(args.repeat):
                    with conn.cursor() as cur:
                        started = time.perf_counter()
                        write(cur, table, rows)
                        best = min(best, time.perf_counter() - started)
                        cur.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
                        assert cur.fetchone()[0] == len(rows)
                    conn.rollback()
                print(f"| {shape} | {way} | {best * 1000:.1f} | {len(rows) / best:,.0f} |")
    finally:
        with conn.cursor() as cur:
            for shape in SHAPES:
                cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(f"bench_copy_{shape}")))
        conn.commit()
        conn.close()


if __name__ == "__main__":
    main()
