"""Formatting for the dashboard: numbers, durations and status badges that never rely on colour alone."""
from django import template
from django.utils.html import format_html

register = template.Library()

# Each status has a text, a colour class and a symbol: readable in grey-scale and by screen readers.
STATUS_STYLE = {
    "OK": ("ok", "✓"), "WARN": ("warn", "▲"), "ERR": ("err", "✕"), "STALL": ("stall", "❚❚"),
    "STOP": ("stop", "■"), "REWIND": ("rewind", "↺"), "UNKNOWN": ("unknown", "?"),
}


@register.simple_tag
def status_badge(status):
    status = (status or "UNKNOWN").upper()
    css, symbol = STATUS_STYLE.get(status, ("unknown", "?"))
    return format_html('<span class="badge badge-{}" title="status {}"><span aria-hidden="true">{}</span> {}</span>',
                       css, status, symbol, status)


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
    if seconds is None:
        return "—"
    seconds = float(seconds)
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
