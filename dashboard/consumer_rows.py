"""The cells of the overview's tables (pipelines, watches, other groups), formatted once per row in Python.

These tables list every pipeline, watch and sampled group: hundreds of rows, polled every 2 s. Django's template
engine spends about 10 µs on each variable, filter and tag of each row, which made the page cost seconds; here
each cell is made with the very filters the templates use (templatetags/tally.py, Django's timesince and date),
so the page shows the same text, and the templates only place the cells. The rows themselves (status, counts)
come from dashboard.status and consumers.reconciliation.monitored, unchanged.
"""
import html
from datetime import datetime, timedelta

from django.template.defaultfilters import slugify
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from dashboard.templatetags.tally import duration, group_url, nonzero_class, num, status_badge

COUNTS = ("lost", "duplicated", "phantom")


def pipeline_cells(rows, now: datetime | None = None) -> list[dict]:
    """The pipelines table: one dict per dashboard.status.PipelineRow."""
    url, checked = _slug_route("pipeline"), _Checked(now)
    cells = []
    for row in rows:
        p = row.pipeline
        cluster = f"{p.cluster}: " if p.cluster != "default" else ""
        cells.append(_escaped({
            "name": p.name, "status": row.status, "url": url(p.name), "badge": status_badge(row.status),
            "about": f"{cluster}{p.topic} → {p.sink_table} · {p.desired_state}",
            "mode": p.get_delivery_mode_display(), "lag_records": num(row.lag_records),
            "lag_seconds": duration(row.lag_seconds), "throughput": _throughput(row.records_per_second),
            **_counts(row), **checked(row.checked_at),
        }))
    return cells


def watch_cells(consumers, now: datetime | None = None) -> list[dict]:
    """The watches table (the overview's and the Watches page's): one dict per monitored.MonitoredConsumer."""
    url, checked = _slug_route("watch"), _Checked(now)
    return [_escaped({"name": c.name, "status": c.status, "url": url(c.name), "badge": status_badge(c.status),
                      "group_id": c.group_id, "topic": c.topic, "lag_records": num(c.lag_records),
                      "lag_seconds": duration(c.lag_seconds), **_counts(c), **checked(c.checked_at)})
            for c in consumers]


def group_cells(groups, now: datetime | None = None) -> list[dict]:
    """The other consumer groups' table: one dict per dashboard.status.GroupRow."""
    ago = _Ago(now)
    return [_escaped({"group_id": g.group_id, "slug": slugify(g.group_id), "url": group_url(g.group_id),
                      "lag_records": num(g.lag_records), "lag_seconds": duration(g.lag_seconds),
                      "throughput": _throughput(g.records_per_second), "ago": ago(g.taken_at)})
            for g in groups]


def _escaped(cells: dict) -> dict:
    """Each text cell HTML-escaped here, once (what autoescaping does, without its cost per template variable),
    and marked safe so the template places it as it is; markup made by a tag (the badge) stays as it is."""
    return {name: value if value is None or hasattr(value, "__html__") else SafeString(html.escape(str(value)))
            for name, value in cells.items()}


def _slug_route(view_name: str):
    """reverse() for many names of one route with a single slug: reversed once, each name put in the slug's
    place (a slug needs no quoting)."""
    marker = "0-name-0"
    before, after = reverse(view_name, args=[marker]).split(marker)
    return lambda name: f"{before}{name}{after}"


def _throughput(records_per_second) -> str:
    return "—" if records_per_second is None else f"{num(records_per_second)}/s"


def _counts(row) -> dict:
    """Lost, duplicated, phantom and their cells' classes: a count that is not zero is marked with ⚠ as well as
    with colour."""
    cells = {}
    for field in COUNTS:
        value = getattr(row, field)
        cells[field] = f"⚠ {num(value)}" if value else num(value)
        cells[f"{field}_css"] = nonzero_class(value)
    return cells


class _Ago:
    """Django's timesince (the `timesince` filter) against one `now` for many moments. Under 28 days its text
    depends only on the whole minutes elapsed (no month boundary can fall in between), so rows reconciled in the
    same minutes share one text instead of each paying for the calendar arithmetic and translations."""

    MEMO_LIMIT = timedelta(days=28)

    def __init__(self, now: datetime | None):
        self.now, self.texts = now or timezone.now(), {}

    def __call__(self, moment: datetime | None) -> str:
        if not moment:
            return ""
        elapsed = self.now - moment
        if not timedelta(0) <= elapsed < self.MEMO_LIMIT:
            return timesince(moment, self.now)
        minutes = elapsed // timedelta(minutes=1)
        if minutes not in self.texts:
            self.texts[minutes] = timesince(moment, self.now)
        return self.texts[minutes]


class _Checked:
    """The "checked" cell: when (ISO 8601 in the current time zone, what the `date:'c'` filter writes) and how
    long ago; both None for a consumer never checked."""

    def __init__(self, now: datetime | None):
        self.ago, self.zone = _Ago(now), timezone.get_current_timezone()

    def __call__(self, checked_at: datetime | None) -> dict:
        if not checked_at:
            return {"checked_iso": None, "checked_ago": None}
        return {"checked_iso": checked_at.astimezone(self.zone).isoformat(), "checked_ago": self.ago(checked_at)}
