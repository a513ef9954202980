"""The delivery-guarantees demo page: start a run (operators), watch each sink fill in, compare them."""
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from consumers.access import can_operate
from consumers.demo import runs as demo_runs
from consumers.demo.classic import DEMO_PIPELINES, new_seed, sink_counts, summarize_counts
from consumers.demo.schedule import MAX_SEED
from consumers.models import DeliveryMode, Pipeline
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import render_page

DEFAULT_RECORDS = 100
DEFAULT_CRASH_PROBABILITY = 0.2
# "The classic example" preset: the blog post's setup -- topic nums with 1..100, polls of 10
# (max_poll_records=10, DEMO_BATCH_SIZE), the consumer killed and restarted several times at random moments
# of its poll-commit-write cycle. Only a seed and settings: what the run loses comes from the run. With
# this seed each classic consumer is killed three times; one of the at-most-once consumer's kills falls
# between its Kafka commit and its write (tests/test_demo.py derives the loss from the schedule).
CLASSIC_PRESET = {"records": 100, "crash_probability": 0.15, "seed": 618}
# The post's `select count(*)`. Its consumer inserted row by row, so its kill lost the rest of a poll
# (9 of 10); Tally writes a poll in one transaction, so a kill there loses the whole poll.
CLASSIC_POST = {"received": 91, "records": 100}


def value_ranges(values: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> "1–3, 7, 9–10": the values named, short enough to read."""
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}–{v}")
            start = None
    return ", ".join(parts)


def _cells(counts: dict[int, int], records: int) -> list[dict]:
    cells = []
    for value in range(1, records + 1):
        count = counts.get(value, 0)
        kind = "lost" if count == 0 else "once" if count == 1 else "dup"
        label = {"lost": "not in the sink", "once": "once", "dup": f"{count} times"}[kind]
        cells.append({"value": value, "count": count, "kind": kind, "label": f"{value}: {label}"})
    return cells


def _columns(state: dict | None) -> list[dict]:
    """One card per demo pipeline, in the demo's order: its run's state and crashes, and what its sink
    holds right now (read from PostgreSQL on every poll, so the grid fills in while it runs)."""
    state = state or {}
    results = state.get("pipelines") or {}
    reconciliation = state.get("reconciliation") or {}
    health = {p.name: getattr(p, "health", None)
              for p in Pipeline.objects.select_related("health").filter(name__in=[d.name for d in DEMO_PIPELINES])}
    records = int(state.get("records") or DEFAULT_RECORDS)
    columns = []
    for demo in DEMO_PIPELINES:
        result = results.get(demo.name, {})
        counts = sink_counts(demo.sink_table) if state else {}
        summary = summarize_counts(counts, records)
        numbers = reconciliation.get(demo.name) or {}
        if not numbers and health.get(demo.name) is not None and result.get("state") == "done":
            h = health[demo.name]
            numbers = {"status": h.status, "lost": h.lost, "duplicated": h.duplicated, "phantom": h.phantom}
        duplicated = summary["duplicated"]
        columns.append({
            "name": demo.name, "mode": demo.delivery_mode, "mode_label": DeliveryMode(demo.delivery_mode).label,
            "engine": demo.engine, "result": result, "done": result.get("state") == "done", "records": records,
            "received": summary["distinct"], "rows": summary["rows"], "missing": summary["missing"],
            "missing_named": value_ranges(summary["missing"]), "duplicated": duplicated,
            "duplicated_named": ", ".join(f"{v}×{c}" for v, c in duplicated.items()),
            "extra_rows": sum(c - 1 for c in duplicated.values()),
            "exact": not summary["missing"] and not duplicated, "reconciliation": numbers,
            "crashes": result.get("crashes") or [], "cells": _cells(counts, records)})
    return columns


def _context(request):
    state = demo_runs.current_state()   # "running" only while its run holds the demo lock
    return {"nav": "demo", "state": state, "columns": _columns(state), "can_operate": can_operate(request.user),
            "running": bool(state and state.get("state") in demo_runs.ACTIVE_STATES),
            "classic": CLASSIC_PRESET, "post": CLASSIC_POST, "max_seed": MAX_SEED,
            "defaults": {"records": DEFAULT_RECORDS, "crash_probability": DEFAULT_CRASH_PROBABILITY}}


@require_GET
@login_required
def demo_page(request):
    return render_page(request, "demo.html", _context(request), fragment="progress")


def _parse(post) -> tuple[int, float, int, str]:
    """The run's settings from the form: the classic preset, or records, probability and a seed (blank:
    a new one). Raises ValueError with the message to show."""
    if post.get("preset") == "classic":
        return CLASSIC_PRESET["records"], CLASSIC_PRESET["crash_probability"], CLASSIC_PRESET["seed"], "classic"
    if post.get("preset"):
        raise ValueError("Unknown preset.")
    try:
        records = int(post.get("records", DEFAULT_RECORDS))
        crash_probability = float(post.get("crash_probability", DEFAULT_CRASH_PROBABILITY))
    except ValueError:
        raise ValueError("Records must be 1–10,000 and the crash probability 0–0.9.") from None
    if not (1 <= records <= 10_000 and 0.0 <= crash_probability <= 0.9):
        raise ValueError("Records must be 1–10,000 and the crash probability 0–0.9.")
    raw_seed = (post.get("seed") or "").strip()
    if not raw_seed:
        return records, crash_probability, new_seed(), ""
    if not raw_seed.isdigit() or int(raw_seed) > MAX_SEED:
        raise ValueError(f"The seed must be a whole number from 0 to {MAX_SEED}, or blank for a new one.")
    return records, crash_probability, int(raw_seed), ""


@require_POST
@login_required
def demo_run(request):
    if not can_operate(request.user):
        return refuse_viewer(request, None)
    try:
        records, crash_probability, seed, preset = _parse(request.POST)
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("demo")
    try:
        demo_runs.request_run(records, crash_probability, request.user.username, seed, preset)
    except demo_runs.DemoBusy as exc:
        messages.error(request, str(exc))
    else:
        what = "the classic example" if preset else f"{records} records, crash probability {crash_probability}"
        messages.success(request, f"Demo started: {what}, seed {seed}.")
    return redirect("demo")
