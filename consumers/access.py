"""Who may do what, and the record of every refusal: one home for every door (pages, JSON API, Django admin,
alerts pages and API, the command line).

Roles are Django groups (dashboard/roles.py creates them): viewers read, operators also act. Reading needs
`consumers.view_pipeline`, acting `consumers.operate_pipeline` (superusers have both), so a role can also be
granted to one user without the group. A signed-in user with neither has no role and sees nothing.

A refusal is audited like an action: one ActionLog row, result "refused", naming who tried what and why.
`record_refusal` never raises: the caller decides the answer (a 403, a 400, a `Refused`), and a request
that is refused changes nothing but this row.
"""
import logging

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.utils import timezone

from consumers.models import ActionLog, ActionResult
from consumers.models.text import fit, storable_json
from consumers.pg_text import storable

log = logging.getLogger("tally.refusals")

OPERATE_PERMISSION = "consumers.operate_pipeline"
VIEW_PERMISSION = "consumers.view_pipeline"

# A refusal records what was tried, not whole request bodies.
MAX_PARAM_CHARS = 200


class AuditedRefusal(PermissionDenied):
    """A 403 whose refusal the door has written to the action log already. The admin site writes every other
    PermissionDenied its views raise (consumers.admin_site), so this one is not written twice."""


def can_operate(user) -> bool:
    return bool(user and user.is_authenticated and user.has_perm(OPERATE_PERMISSION))


def can_view(user) -> bool:
    return bool(user and user.is_authenticated and (user.has_perm(VIEW_PERMISSION) or can_operate(user)))


def role_of(user) -> str:
    """"operator", "viewer" or "none"."""
    return "operator" if can_operate(user) else "viewer" if can_view(user) else "none"


# The action a refused write is logged under, where the URL's name is not the name its success is logged
# under: a filter of the action log by action then finds both.
REFUSED_AS = {
    ("new_pipeline", "POST"): "create",
    ("group_reset", "POST"): "reset_group",
    ("new_watch", "POST"): "create_watch",
    ("api:pipelines", "POST"): "create",
    ("api:reconciliation", "POST"): "reconcile",
    ("api:group_reset", "POST"): "reset_group",
    ("api:topic_checks", "POST"): "topic_check",
    ("api:watches", "POST"): "create_watch",
    ("api:watch", "DELETE"): "delete_watch",
    ("api:watch_check", "POST"): "check_watch",
    ("alerts_api:acknowledge", "POST"): "acknowledge_alert",
    ("alerts_api:mute", "POST"): "mute_alert",
    ("alerts_api:channels", "POST"): "alert_channel_add",
    ("alerts_api:channel", "DELETE"): "alert_channel_delete",
    ("alerts_api:channel_test", "POST"): "alert_channel_test",
    ("api:token", "POST"): "make_token",
    ("api:token", "DELETE"): "revoke_token",
}


def refused_action(request, default: str = "action") -> str:
    """The action a refused request is logged under: REFUSED_AS's, else the URL's name (the action log's name
    for most writes, by the URL confs' convention)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return default
    return REFUSED_AS.get((match.view_name, request.method)) or match.url_name or default


def actor_of(user) -> str:
    """The action log's name for `user` (a User, a name such as "cli", or nobody: "anonymous")."""
    if isinstance(user, str):
        return user or "anonymous"
    return (getattr(user, "get_username", lambda: "")() if user is not None else "") or "anonymous"


def record_refusal(user, action: str, reason: str, *, pipeline=None, group_id: str = "", params: dict | None = None,
                   dry_run: bool = False, entry: ActionLog | None = None) -> ActionLog | None:
    """Write the refusal (a new row, or `entry` when the action was already logged as running) and return it.
    Every string is made storable and cut to its column; a failure to write is logged, never raised."""
    actor = actor_of(user)
    fields = {"result": ActionResult.REFUSED, "message": fit(ActionLog, "message", reason),
              "finished_at": timezone.now()}
    try:
        with transaction.atomic():  # a savepoint: a failed write leaves the caller's transaction usable
            if entry is not None:
                ActionLog.objects.filter(pk=entry.pk).update(**fields)
                entry.refresh_from_db()
            else:
                entry = ActionLog.objects.create(
                    pipeline=pipeline, group_id=fit(ActionLog, "group_id", group_id or ""),
                    action=fit(ActionLog, "action", action), actor=fit(ActionLog, "actor", actor),
                    params=storable_json(params or {}, max_chars=MAX_PARAM_CHARS), dry_run=dry_run, **fields)
    except DatabaseError:
        log.exception("could not record the refusal of %s by %s", storable(action), storable(actor))
        return None
    log.info("%s by %s refused: %s", fit(ActionLog, "action", action), fit(ActionLog, "actor", actor),
             fields["message"][:MAX_PARAM_CHARS])
    return entry


def form_errors(form) -> str:
    """A form's errors as one line for the action log: "field: message; field: message"."""
    return "; ".join(f"{field}: {' '.join(errors)}" if field != "__all__" else " ".join(errors)
                     for field, errors in form.errors.items())
