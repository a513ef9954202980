"""API permissions: every endpoint needs a signed-in user (session or token); actions need operators."""
from rest_framework.permissions import SAFE_METHODS, BasePermission

from consumers.access import can_operate, can_view, record_refusal


class HasRole(BasePermission):
    """Viewers and operators only: a signed-in user (session or token) in neither role is refused, audited."""

    message = "Your account has no role: ask an administrator for the viewers or operators role."

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated) or can_view(user):
            return True  # anonymous requests are IsAuthenticated's to refuse
        record_refusal(user, "view", "no role: " + self.message, params={"path": request.path,
                                                                         "method": request.method})
        return False


class OperatorForWrites(HasRole):
    message = ("Only operators may act (start, stop, pause, resume, restart, rewind, reset a group): "
               "you have the viewer role.")

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        if request.method in SAFE_METHODS or can_operate(request.user):
            return True
        if request.user and request.user.is_authenticated:
            refuse(request, "viewer role: " + self.message)
        return False


def refuse(request, reason: str, kwargs: dict | None = None) -> None:
    """Audit an API refusal under the action the URL names (its `action`, else the URL's name), with the
    pipeline or group it concerns."""
    from consumers.models import Pipeline

    if kwargs is None:
        kwargs = getattr(request, "parser_context", {}).get("kwargs", {}) or {}
    action = kwargs.get("action") or getattr(request.resolver_match, "url_name", "") or "api"
    pipeline = Pipeline.objects.filter(name=kwargs["name"]).first() if kwargs.get("name") else None
    record_refusal(request.user, action, reason, pipeline=pipeline, group_id=kwargs.get("group_id", ""),
                   params={"path": request.path})
