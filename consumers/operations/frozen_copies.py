"""Ends engine writes frozen in the middle of a COPY, so their locks cannot block restarts, stops and rewinds.

An engine connection ends a transaction that waits for its process longer than TALLY_ENGINE_IDLE_TRANSACTION_SECONDS
(PostgreSQL's idle-in-transaction limit, consumers/engine/db.py). A process frozen (stopped, swapped out, cut off)
in the middle of a COPY escapes that limit: its session is not idle but active, reading the client's data, and
PostgreSQL handles neither that limit nor a statement timeout while it waits there. Its transaction then held the
pipeline row FOR SHARE (commit protocol step 1) for good, and every epoch bump waited on it. A beat task ends such
sessions once their COPY is older than the same limit: a batch's COPY streams rows already in memory and takes
well under a second, so one running that long has stopped. Ending the session rolls its batch back; the frozen
process, if it wakes, finds its connection gone, and its epoch is fenced by then.
"""
import logging

from django.conf import settings
from django.db import connection

from consumers.engine.db import ENGINE_APPLICATION_NAME
from consumers.engine.spark_commit import APPLICATION_NAME as SPARK_TASK_APPLICATION_NAME

log = logging.getLogger("tally.supervisor")

_END_FROZEN_COPIES = """
    SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND (application_name = %s OR application_name LIKE %s)
      AND state = 'active' AND wait_event = 'ClientRead' AND query ILIKE 'COPY %%'
      AND query_start < clock_timestamp() - make_interval(secs => %s)
"""


def end_frozen_copies(older_than_seconds: int | None = None) -> list[int]:
    """End every engine session whose COPY has waited for its client longer than `older_than_seconds` (by default
    TALLY_ENGINE_IDLE_TRANSACTION_SECONDS; 0 there means no limit, and nothing is ended). Returns their PIDs."""
    limit = settings.TALLY_ENGINE_IDLE_TRANSACTION_SECONDS if older_than_seconds is None else older_than_seconds
    if not limit:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_END_FROZEN_COPIES, [ENGINE_APPLICATION_NAME, f"{SPARK_TASK_APPLICATION_NAME}-%", limit])
        ended = [pid for pid, _ in cursor.fetchall()]
    for pid in ended:
        log.warning("ended engine session %s: its COPY waited for its process over %s s (frozen mid-write)", pid, limit)
    return ended
