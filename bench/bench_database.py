"""The benchmarks' own PostgreSQL databases: made before a run and migrated, dropped after one (`--drop`).

Imported by the bench scripts (`python bench/bench_x.py` puts this folder on the path).
"""
import os
from urllib.parse import urlparse

import psycopg2
from psycopg2 import sql


def _admin(database_url: str):
    url = urlparse(database_url)
    conn = psycopg2.connect(host=url.hostname, port=url.port or 5432, user=url.username or "postgres",
                            dbname="postgres")
    conn.autocommit = True
    return conn, sql.Identifier(url.path.lstrip("/"))


def setup_django(database_url: str, *, fresh: bool, debug: bool | None = False) -> None:
    """Point Django at `database_url`, make the database (anew when `fresh`, else only if it is missing), set
    Django up and migrate. `debug`: DEBUG for the run (None leaves the development default)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tally.settings")
    os.environ.setdefault("TALLY_DEVELOPMENT", "1")  # a checkout's bench is development, like manage.py
    if debug is not None:
        os.environ["DEBUG"] = "1" if debug else "0"
    admin, name = _admin(database_url)
    with admin.cursor() as cur:
        if fresh:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(name))
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [urlparse(database_url).path.lstrip("/")])
        if not cur.fetchone():
            cur.execute(sql.SQL("CREATE DATABASE {}").format(name))
    admin.close()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drop_database(database_url: str) -> None:
    """Close this process's connections to the benchmark's database, then drop it."""
    from django.db import connections

    connections.close_all()
    admin, name = _admin(database_url)
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(name))
    admin.close()
