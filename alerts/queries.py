"""Listing alerts with the page's and the API's filters (one place, so both agree)."""
from django.db.models import Q

from alerts.models import OPEN_STATES, Alert, AlertState, Mute

# The page shows this many alerts: the newest matter; older ones are in the admin.
PAGE_SIZE = 200
STATE_FILTERS = ("open", *AlertState.values, "all")
MAX_MUTE_REASON = Mute._meta.get_field("reason").max_length
MAX_MUTE_MINUTES = 30 * 24 * 60


def filtered_alerts(state: str = "open", pipeline: str = ""):
    """The alerts a filter selects; a state outside STATE_FILTERS is the caller's to refuse (ValueError)."""
    if state not in STATE_FILTERS:
        raise ValueError(f"unknown state filter {state!r}")
    alerts = Alert.objects.select_related("rule", "pipeline", "watch").order_by("-started_at", "-pk")
    if state == "open":
        alerts = alerts.filter(state__in=OPEN_STATES)
    elif state != "all":
        alerts = alerts.filter(state=state)
    if pipeline:
        # A pipeline's or a watch's name; a deleted one's alerts keep its name: its history is still found by name.
        alerts = alerts.filter(Q(pipeline__name=pipeline) | Q(watch__name=pipeline)
                               | Q(pipeline__isnull=True, watch__isnull=True, pipeline_name=pipeline))
    return alerts


def unknown_state_message(state: str) -> str:
    return f"Unknown state {state[:40]!r}: choose one of {', '.join(STATE_FILTERS)}."


def parse_minutes(value, default=60) -> int | None:
    """Mute length in minutes: 1 minute to 30 days, else None (invalid)."""
    try:
        minutes = int(value if value not in (None, "") else default)
    except (TypeError, ValueError):
        return None
    return minutes if 1 <= minutes <= MAX_MUTE_MINUTES else None


def mute_problem(minutes: int | None, reason: str) -> str:
    """Why a mute's input is refused, "" when it is not: the alerts page's and the admin's one check (the API's
    serializer checks the same bounds). `minutes` as parse_minutes read it."""
    if minutes is None:
        return "Mute for 1 minute to 30 days."
    if len(reason) > MAX_MUTE_REASON:
        return f"The reason is longer than {MAX_MUTE_REASON} characters."
    return ""
