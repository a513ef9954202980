"""Raw psycopg2 connections for the engines' hot path (COPY, row locks, one transaction per batch).

`connect()` opens one. `engine_connection()` lends one from the process's pool: an engine takes a connection
for each batch's transaction (and for reading or setting positions) and gives it back, so the runs of one
process share at most `TALLY_ENGINE_DB_CONNECTIONS` connections. Why: an engine host holds hundreds of runs
(consumers/engine/hosts.py), almost all idle, and PostgreSQL's connections are few (100 by default); a
connection held per run would cap a worker far below what its memory and cores allow.
"""
import os
import threading
from contextlib import contextmanager

import psycopg2
from django.conf import settings


def connect(application_name: str = "tally"):
    db = settings.DATABASES["default"]
    params = {"dbname": db["NAME"], "user": db.get("USER") or None, "password": db.get("PASSWORD") or None,
              "host": db.get("HOST") or None, "port": db.get("PORT") or None,
              "application_name": application_name}
    conn = psycopg2.connect(**{k: v for k, v in params.items() if v is not None})
    conn.autocommit = False
    return conn


class ConnectionPool:
    """At most `size` open engine connections, lent one at a time; a borrower waits while all are lent."""

    def __init__(self, size: int, application_name: str = "tally-engine"):
        self.application_name = application_name
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list = []
        self._lock = threading.Lock()

    @contextmanager
    def connection(self):
        """A connection with no transaction open; given back with none open (rolled back if the borrower left
        one), or closed when the borrower's work broke it."""
        self._slots.acquire()
        conn = None
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = connect(self.application_name)
            yield conn
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def _give_back(self, conn) -> None:
        if not conn.closed:
            try:
                conn.rollback()   # nothing, after a commit; a failed batch's leftovers otherwise
            except psycopg2.Error:
                conn.close()
        if not conn.closed:
            with self._lock:
                self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


_pool: ConnectionPool | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def engine_connection():
    """Borrow one of this process's engine connections: `with db.engine_connection() as conn: ...`."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():   # a forked child never shares its parent's sockets
            _pool, _pool_pid = ConnectionPool(settings.TALLY_ENGINE_DB_CONNECTIONS), os.getpid()
        pool = _pool
    return pool.connection()


def close_pool() -> None:
    """Close this process's idle engine connections (a test session's end, before its database goes)."""
    if _pool is not None and _pool_pid == os.getpid():
        _pool.close()
