"""API permissions: every endpoint needs a signed-in user (session or token); actions need operators."""
from rest_framework.permissions import SAFE_METHODS, BasePermission

from consumers.access import can_operate, record_refusal


class OperatorForWrites(BasePermission):
    message = ("Only operators may act (start, stop, pause, resume, restart, rewind, reset a group): "
               "you have the viewer role.")

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS or can_operate(request.user):
            return True
        if request.user and request.user.is_authenticated:
            from consumers.models import Pipeline

            kwargs = getattr(request, "parser_context", {}).get("kwargs", {}) or {}
            action = kwargs.get("action") or getattr(request.resolver_match, "url_name", "") or "api"
            pipeline = Pipeline.objects.filter(name=kwargs.get("name", "")).first() if kwargs.get("name") else None
            record_refusal(request.user, action, "viewer role: " + self.message, pipeline=pipeline,
                           group_id=kwargs.get("group_id", ""), params={"path": request.path})
        return False
