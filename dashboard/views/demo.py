"""The delivery-guarantees demo page: start a run (operators), watch its progress, compare the sinks."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from consumers.demo import runs as demo_runs
from consumers.demo.classic import DEMO_PIPELINES
from consumers.models import DeliveryMode, Pipeline
from dashboard.roles import can_operate
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page

DEFAULT_RECORDS = 100
DEFAULT_CRASH_PROBABILITY = 0.2


def _columns(state: dict | None) -> list[dict]:
    """One column per delivery mode, in the demo's order, with what the sink received."""
    state = state or {}
    results = state.get("pipelines") or {}
    reconciliation = state.get("reconciliation") or {}
    health = {p.name: getattr(p, "health", None)
              for p in Pipeline.objects.select_related("health").filter(name__in=[d.name for d in DEMO_PIPELINES])}
    records = int(state.get("records") or DEFAULT_RECORDS)
    columns = []
    for demo in DEMO_PIPELINES:
        result = results.get(demo.name, {})
        missing = set(result.get("missing") or [])
        duplicated = {int(k): v for k, v in (result.get("duplicated") or {}).items()}
        numbers = reconciliation.get(demo.name) or {}
        if not numbers and health.get(demo.name) is not None:
            h = health[demo.name]
            numbers = {"status": h.status, "lost": h.lost, "duplicated": h.duplicated, "phantom": h.phantom}
        cells = [{"value": v, "missing": v in missing, "count": duplicated.get(v, 1)} for v in range(1, records + 1)]
        columns.append({"name": demo.name, "mode": demo.delivery_mode,
                        "mode_label": DeliveryMode(demo.delivery_mode).label, "result": result,
                        "has_rows": "rows" in result, "missing": sorted(missing), "duplicated": duplicated,
                        "extra_rows": sum(c - 1 for c in duplicated.values()), "reconciliation": numbers,
                        "cells": cells, "exact": "rows" in result and not missing and not duplicated})
    return columns


def _context(request):
    state = demo_runs.read_state()
    return {"nav": "demo", "state": state, "columns": _columns(state), "can_operate": can_operate(request.user),
            "running": bool(state and state.get("state") in ("queued", "running")),
            "defaults": {"records": DEFAULT_RECORDS, "crash_probability": DEFAULT_CRASH_PROBABILITY}}


@require_GET
@login_required
def demo_page(request):
    return render_page(request, "demo.html", _context(request), fragment="progress")


@require_POST
@login_required
def demo_run(request):
    if not can_operate(request.user):
        return refuse_viewer(request, None)
    try:
        records = int(request.POST.get("records", DEFAULT_RECORDS))
        crash_probability = float(request.POST.get("crash_probability", DEFAULT_CRASH_PROBABILITY))
        if not (1 <= records <= 10_000 and 0.0 <= crash_probability <= 0.9):
            raise ValueError
    except ValueError:
        messages.error(request, "Records must be 1–10,000 and the crash probability 0–0.9.")
        return redirect("demo")
    try:
        demo_runs.request_run(records, crash_probability, request.user.username)
    except demo_runs.DemoBusy as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Demo started: {records} records, crash probability {crash_probability}.")
    return redirect("demo")
