"""Watches: the list, one watch (partitions, lag history per partition, ranges and their findings) and the form
that adds one. Thin: the form builds the WatchSpec every door builds (consumers/operations/watch_setup.py)."""
from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET

from consumers.access import can_operate, form_errors, record_refusal
from consumers.form_errors import add_problems
from consumers.models import RANGES_SHOWN, LagSnapshot, Watch, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import monitored, watch_listing, watch_trace
from dashboard import consumer_rows
from dashboard.forms import ClusterField
from dashboard.views.actions import add_page
from dashboard.views.common import render_page

CHART_WINDOW = timedelta(hours=6)
CHART_MAX_POINTS = 720


@require_GET
@login_required
def watch_list(request):
    context = {"nav": "watches", "rows": consumer_rows.watch_cells(monitored.watches()),
               "can_operate": can_operate(request.user)}
    return render_page(request, "watches.html", context, fragment="live")


@require_GET
@login_required
def watch_detail(request, name):
    watch = get_object_or_404(Watch, name=name)
    partitions = list(watch.partitions.order_by("partition"))
    lost, duplicated = watch_listing.listed_offsets(watch)
    ranges = list(WatchRange.objects.filter(watch=watch).newest()[:RANGES_SHOWN + 1])  # one more: were any left out?
    context = {"nav": "watches", "watch": watch, "row": monitored.of_watch(watch, partitions),
               "partitions": partitions, "ranges": ranges[:RANGES_SHOWN], "ranges_shown": RANGES_SHOWN,
               "ranges_left_out": len(ranges) > RANGES_SHOWN, "lost_offsets": lost, "duplicated_offsets": duplicated,
               "chart": lag_history(watch, [p.partition for p in partitions])}
    return render_page(request, "watch.html", context)


@require_GET
@login_required
def trace_finding(request, name):
    """offset -> value -> expected row id -> rows found, for one record of the watch's topic."""
    watch = get_object_or_404(Watch, name=name)
    context = {"nav": "watches", "watch": watch, "t": None, "error": "",
               "query": {k: request.GET.get(k, "") for k in ("partition", "offset")}}
    status = 200
    if any(context["query"].values()):
        try:
            partition, offset, _ = watch_trace.parse_request({k: v for k, v in request.GET.items() if k != "key"})
            context["t"] = watch_trace.trace(watch, partition, offset)
        except watch_trace.REFUSALS as exc:  # htmx swaps these statuses too: the form shows why
            context["error"], status = str(exc), watch_trace.refusal_status(exc, bad_request=422)
    return render_page(request, "watch_trace.html", context, fragment="result", status=status)


@require_GET
@login_required
def export_findings(request, name):
    """Every finding of the watch as CSV (the page lists the first 1,000), streamed."""
    watch = get_object_or_404(Watch, name=name)
    return findings_response(watch)


def findings_response(watch: Watch) -> StreamingHttpResponse:
    response = StreamingHttpResponse(watch_trace.findings_csv(watch), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{watch.name}-findings.csv"'
    return response


def lag_history(watch: Watch, partitions: list[int], now=None) -> dict:
    """Lag per partition over the chart window, in the shape static/charts.js draws (x in Unix seconds,
    one series `lag_pN` per partition, aligned on the samples' times)."""
    now = now or timezone.now()
    samples = list(LagSnapshot.objects.filter(watch=watch, partition__isnull=False, taken_at__gte=now - CHART_WINDOW)
                   .order_by("-taken_at").values_list("taken_at", "partition", "lag_records")
                   [: CHART_MAX_POINTS * max(1, len(partitions))])
    times = sorted({s[0] for s in samples})[-CHART_MAX_POINTS:]
    index = {t: i for i, t in enumerate(times)}
    chart = {"t": [round(t.timestamp(), 3) for t in times], "from": round((now - CHART_WINDOW).timestamp(), 3),
             "to": round(now.timestamp(), 3)}
    for p in partitions:
        chart[f"lag_p{p}"] = [None] * len(times)
    for taken_at, p, lag in samples:
        if taken_at in index and f"lag_p{p}" in chart:
            chart[f"lag_p{p}"][index[taken_at]] = lag
    return chart


class WatchForm(forms.Form):
    name = forms.CharField(max_length=100)
    group = forms.CharField(max_length=255, help_text="The consumer group to watch.")
    topic = forms.CharField(max_length=249)
    cluster = ClusterField()
    sink_table = forms.CharField(max_length=watch_setup.MAX_LENGTHS["sink_table"], required=False,
                                 help_text="The table the group writes (optional): table or schema.table.")
    record_id = forms.CharField(max_length=300, required=False, help_text="value, key, json:PATH or offset.")
    row_id = forms.CharField(max_length=200, required=False, help_text="COLUMN, or PART_COL,OFFSET_COL for offset.")
    start_from = forms.CharField(max_length=40, initial="earliest", help_text="earliest, latest or an ISO datetime.")
    settle_seconds = forms.IntegerField(min_value=0, max_value=watch_setup.MAX_SETTLE_SECONDS, initial=30)
    ignore = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                             help_text="One SPEC=VALUE per line: records the consumer skips on purpose.")
    keyed = forms.BooleanField(required=False, help_text="An update stream the consumer upserts (one row per id).")

    def spec(self) -> watch_setup.WatchSpec:
        data = dict(self.cleaned_data)
        data["ignore"] = [line.strip() for line in data["ignore"].splitlines() if line.strip()]
        return watch_setup.WatchSpec(**data)


@add_page
def new_watch(request, operator: bool):
    form = WatchForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                watch, notes = watch_setup.create(form.spec(), actor=request.user.username)
            except watch_setup.Invalid as exc:
                add_problems(form, exc)
            else:
                messages.success(request, " ".join([f"Watching group {watch.group_id} as {watch.name}.", *notes]))
                return redirect("watch", name=watch.name)
        status = 400
        record_refusal(request.user, "create_watch", f"bad input: {form_errors(form)}",
                       params={"watch": request.POST.get("name", "")})
    return render_page(request, "watch_new.html", {"nav": "watches", "form": form, "can_operate": operator},
                       status=status)
