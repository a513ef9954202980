"""The admin's "History and retention" page: how many rows each kind of Tally's history holds, how many are past
their retention setting (deleted at beat's next run), and what ledger compaction has done. Read-only: counts of
the tables, the settings and the ledger's size; nothing here writes."""
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.template.response import TemplateResponse

from consumers.admin_groups import can_view
from consumers.models import BatchLedger
from consumers.operations import retention
from consumers.reconciliation import watch_history

# A table PostgreSQL has not analysed yet has no estimate (reltuples -1): it is counted, up to this many rows.
COUNT_LIMIT = 100_000


def ledger_facts() -> dict:
    """The ledger's size and row count as PostgreSQL's statistics know them: counting millions of rows exactly
    would make this page the slow one."""
    with connection.cursor() as cursor:
        # The table's name as a value: PostgreSQL's regclass cast looks it up.
        cursor.execute("SELECT reltuples::bigint, pg_total_relation_size(oid) FROM pg_class WHERE oid = %s::regclass",
                       [BatchLedger._meta.db_table])
        rows, size = cursor.fetchone()
    estimated = rows >= 0
    if not estimated:
        rows = BatchLedger.objects.all()[:COUNT_LIMIT].count()
    return {"rows": rows, "estimated": estimated, "at_least": not estimated and rows == COUNT_LIMIT, "bytes": size,
            "keep_days": settings.TALLY_LEDGER_KEEP_DAYS}


def history(request, site):
    if not can_view(request.user):
        raise PermissionDenied
    from alerts import retention as alert_retention  # alerts sit above consumers: a door may read both

    kinds = retention.counts() + watch_history.counts() + alert_retention.counts()
    context = {**site.each_context(request), "title": "History and retention", "kinds": kinds,
               "ledger": ledger_facts()}
    return TemplateResponse(request, "admin/consumers/history.html", context)
