"""Reconciliation tasks for Celery beat: verify every pipeline, check every watch, sample lag, keep the samples
bounded, compact the ledger and apply the retention of Tally's own tables.

Thin wrappers: the work is in consumers/reconciliation/reconcile.py and
consumers/reconciliation/snapshots.py. Each returns a small JSON-able summary (visible in the result backend
and the worker log)."""
from celery import shared_task
from django.utils import timezone

from consumers.reconciliation import reconcile, snapshots, watch_audit


@shared_task(name="consumers.reconcile_all")
def reconcile_all_task(full: bool = False) -> dict:
    reports = reconcile.reconcile_all(full=full)
    return {"pipelines": len(reports), "not_exact": [r.name for r in reports if not r.exact],
            "statuses": {r.name: r.status for r in reports}}


@shared_task(name="consumers.reconcile_pipeline")
def reconcile_pipeline_task(pipeline_id: int, full: bool = False) -> dict:
    from consumers.models import Pipeline

    pipeline = Pipeline.objects.filter(pk=pipeline_id).first()
    if pipeline is None:
        return {"pipeline_id": pipeline_id, "error": "no such pipeline"}
    report = reconcile.reconcile_pipeline(pipeline, full=full)
    return {"pipeline": report.name, "status": report.status, "exact": report.exact}


@shared_task(name="consumers.check_watches")
def check_watches_task() -> dict:
    """The delivery audit and lag of every watch (consumer groups Tally does not run)."""
    reports = watch_audit.check_all()
    return {"watches": len(reports), "statuses": {r.watch: r.status for r in reports},
            "findings": {r.watch: {"lost": r.lost, "duplicated": r.duplicated} for r in reports if not r.clean}}


@shared_task(name="consumers.take_lag_snapshots")
def take_lag_snapshots_task() -> dict:
    return {"rows": snapshots.take_snapshots()}


@shared_task(name="consumers.downsample_lag_snapshots")
def downsample_lag_snapshots_task() -> dict:
    return snapshots.downsample()


# A beat run of compaction stops after this long and goes on at the next one: a worker is never held for
# long, and a first compaction of months of ledger spreads over several runs.
COMPACTION_SECONDS_PER_RUN = 60


@shared_task(name="consumers.compact_ledger")
def compact_ledger_task() -> dict:
    from consumers.reconciliation import compaction

    return compaction.compact_all(max_seconds=COMPACTION_SECONDS_PER_RUN).as_json()


@shared_task(name="consumers.apply_retention")
def apply_retention_task() -> dict:
    from consumers.operations import retention
    from consumers.reconciliation import watch_history

    now = timezone.now()
    return {**retention.apply(now), **watch_history.apply(now)}
