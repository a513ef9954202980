"""Formatting for the dashboard: numbers, durations and status badges that never rely on colour alone."""
import functools

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from consumers.models import UNKNOWN

register = template.Library()

# Each status has a text, a colour class and a symbol: readable in grey-scale and by screen readers.
STATUS_STYLE = {
    "OK": ("ok", "✓"), "WARN": ("warn", "▲"), "ERR": ("err", "✕"), "STALL": ("stall", "❚❚"),
    "STOP": ("stop", "■"), "REWIND": ("rewind", "↺"), UNKNOWN: ("unknown", "?"),
}


@register.simple_tag
def status_badge(status):
    return _badge((status or UNKNOWN).upper())


@functools.lru_cache(maxsize=64)   # a handful of statuses, drawn hundreds of times on the overview
def _badge(status: str):
    css, symbol = STATUS_STYLE.get(status, ("unknown", "?"))
    return format_html('<span class="badge badge-{}" title="status {}"><span aria-hidden="true">{}</span> {}</span>',
                       css, status, symbol, status)


@register.simple_tag(takes_context=True)
def viewer_disabled(context, what: str):
    """A form button's attributes for a viewer: disabled, saying that only operators can `what`."""
    if context.get("can_operate"):
        return ""
    return format_html(' disabled title="Only operators can {}"', what)


@register.filter
def group_url(group_id) -> str:
    """The group page's URL, or "" for an id no URL can hold (a newline, say: Kafka allows it, and a refusal
    stores what was asked). A page listing such an id shows it as text instead of failing."""
    try:
        return reverse("group", kwargs={"group_id": group_id})
    except NoReverseMatch:
        return ""


@register.filter
def num(value):
    """12345 -> "12,345"; None -> "—"."""
    if value is None or value == "":
        return "—"
    if isinstance(value, float):
        return f"{value:,.1f}"
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return value


@register.filter
def duration(seconds):
    """Lag in seconds, for people: 0.4 s, 12.5 s, 3 min 5 s, 2 h 10 min."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):  # None, or "" for a missing value in a template
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


@register.filter
def nonzero_class(value):
    """'bad' when a loss/duplication count is not zero: the cell is also marked with text, see template."""
    return "bad" if value else ""


@register.filter
def as_text(value):
    """Bytes of a Kafka record for display (dead letters): UTF-8 where possible, else repr."""
    if value is None:
        return "—"
    if isinstance(value, memoryview):
        value = value.tobytes()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return repr(value)
    return str(value)


@register.filter
def offset_changes(action):
    """An action's offsets for people: "p0 10 → 6 · p1 10 → 6", or "p0 10" when nothing moved."""
    before, after = action.offsets_before or {}, action.offsets_after or {}
    if not isinstance(before, dict) or not isinstance(after, dict) or not (before or after):
        return "—"
    parts = []
    for partition in sorted(set(before) | set(after), key=lambda p: int(p) if str(p).isdigit() else str(p)):
        old, new = before.get(partition), after.get(partition)
        if old == new or new is None:
            parts.append(f"p{partition} {_plain(old)}")
        else:
            parts.append(f"p{partition} {_plain(old)} → {_plain(new)}")
    return " · ".join(parts)


def _plain(value):
    return "—" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


@register.filter
def action_target(action):
    """The pipeline an entry is about, also after the pipeline was deleted (its name stays in params)."""
    return action.pipeline_name
