"""Reconciliation tasks for Celery beat: verify every pipeline, sample lag, keep the samples bounded.

Thin wrappers: the work is in consumers/reconciliation/reconcile.py and
consumers/reconciliation/snapshots.py. Each returns a small JSON-able summary (visible in the result backend
and the worker log)."""
from celery import shared_task

from consumers.reconciliation import reconcile, snapshots


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


@shared_task(name="consumers.take_lag_snapshots")
def take_lag_snapshots_task() -> dict:
    return {"rows": snapshots.take_snapshots()}


@shared_task(name="consumers.downsample_lag_snapshots")
def downsample_lag_snapshots_task() -> dict:
    return snapshots.downsample()
