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
from urllib.parse import quote

import psycopg2
from django.conf import settings

# The engines' connections say what they are (pg_stat_activity): consumers/operations/frozen_copies.py finds them so.
ENGINE_APPLICATION_NAME = "tally-engine"


def connect(application_name: str = "tally", idle_in_transaction_seconds: int | None = None):
    """A new connection; with `idle_in_transaction_seconds`, PostgreSQL ends its session when a transaction
    of it waits that long for its client."""
    db = settings.DATABASES["default"]
    params = {"dbname": db["NAME"], "user": db.get("USER") or None, "password": db.get("PASSWORD") or None,
              "host": db.get("HOST") or None, "port": db.get("PORT") or None,
              "application_name": application_name}
    if idle_in_transaction_seconds:
        params["options"] = f"-c idle_in_transaction_session_timeout={idle_in_transaction_seconds * 1000}"
    conn = psycopg2.connect(**{k: v for k, v in params.items() if v is not None})
    conn.autocommit = False
    return conn


def database_url() -> str:
    """A URL for the database this process uses right now (the test database under pytest): child processes
    get it as DATABASE_URL."""
    db = settings.DATABASES["default"]
    auth = quote(db.get("USER") or "postgres", safe="")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"], safe="")
    return f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


class ConnectionPool:
    """At most `size` open engine connections, lent one at a time; a borrower waits while all are lent."""

    def __init__(self, size: int, application_name: str = ENGINE_APPLICATION_NAME):
        self.application_name, self.size = application_name, size
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list = []
        self._lock = threading.Lock()
        self.closed = False   # replaced (its setting changed) or closed: a connection given back is closed

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
                # A batch's transaction whose process froze (a hung engine host) holds the pipeline row and the
                # positions locked: the supervisor's restart and an operator's stop would wait on it for ever.
                # Its run counts as dead after a lease; PostgreSQL ends the transaction a while later (a batch's
                # transform, inside the transaction, may take longer than a lease and must not be cut off).
                conn = connect(self.application_name, settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS)
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
        with self._lock:
            if not conn.closed and not self.closed:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections now, and each lent one when it comes back."""
        with self._lock:
            self.closed = True
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
        # A forked child never shares its parent's sockets; a changed setting (tests) gets a pool of its size.
        if _pool is None or _pool_pid != os.getpid() or _pool.size != settings.TALLY_ENGINE_DB_CONNECTIONS:
            if _pool is not None and _pool_pid == os.getpid():
                _pool.close()
            _pool, _pool_pid = ConnectionPool(settings.TALLY_ENGINE_DB_CONNECTIONS), os.getpid()
        pool = _pool
    return pool.connection()


def close_pool() -> None:
    """Close this process's engine connections: the idle ones now, the lent ones as they come back (a test
    session's end, before its database goes). The next borrower gets a new pool."""
    global _pool
    with _pool_lock:
        if _pool is not None and _pool_pid == os.getpid():
            _pool.close()
            _pool = None


# --- turns at a Django connection ----------------------------------------------------------------------------
# A run's thread uses its own Django connection only while it starts and while it ends (the beat and the pool
# serve it in between). When hundreds of runs start or end together (a worker taking its queue, a shutdown),
# those connections would all open at once, past PostgreSQL's limit: a thread takes a turn first, at most
# TALLY_ENGINE_DB_CONNECTIONS at once per process, and gives it back with its connection closed.
_turns: threading.BoundedSemaphore | None = None
_turns_pid = _turns_size = 0
_turn_held = threading.local()


def take_turn() -> None:
    """Wait for a turn at a Django connection (no-op if this thread holds one)."""
    global _turns, _turns_pid, _turns_size
    if getattr(_turn_held, "held", False):
        return
    with _pool_lock:
        size = settings.TALLY_ENGINE_DB_CONNECTIONS
        if _turns is None or _turns_pid != os.getpid() or _turns_size != size:
            _turns, _turns_pid, _turns_size = threading.BoundedSemaphore(size), os.getpid(), size
        turns = _turns
    turns.acquire()
    _turn_held.held, _turn_held.turns = True, turns


def holds_turn() -> bool:
    return getattr(_turn_held, "held", False)


def end_turn() -> None:
    """Close this thread's Django connection and give its turn back (if it holds one)."""
    from django.db import connection

    connection.close()
    if getattr(_turn_held, "held", False):
        _turn_held.held = False
        _turn_held.turns.release()
