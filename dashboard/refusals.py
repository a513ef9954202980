"""Refusals are logged like actions: who tried what, and why it was refused (a viewer pressing an
operator's button, bad input). One row in the action log each, result "refused"."""
import logging

from django.utils import timezone

from consumers.models import ActionLog, ActionResult

log = logging.getLogger("tally.refusals")

MAX_PARAM_CHARS = 200  # a refusal records what was tried, not whole request bodies


def _short(value):
    text = value if isinstance(value, str) else repr(value)
    # NUL cannot be stored in PostgreSQL text; the action log shows it escaped.
    return text.replace("\x00", "\\x00")[:MAX_PARAM_CHARS]


def record_refusal(user, action: str, reason: str, *, pipeline=None, group_id: str = "",
                   params: dict | None = None) -> ActionLog:
    actor = getattr(user, "username", "") or "anonymous"
    entry = ActionLog.objects.create(
        pipeline=pipeline, group_id=_short(group_id)[:255], action=_short(action)[:30], actor=actor,
        params={_short(k): _short(v) for k, v in (params or {}).items()}, result=ActionResult.REFUSED,
        message=_short(reason) if len(reason) <= MAX_PARAM_CHARS else reason.replace("\x00", "\\x00")[:2000],
        finished_at=timezone.now())
    log.info("%s by %s refused: %s", action, actor, reason)
    return entry


def form_errors(form) -> str:
    return "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
