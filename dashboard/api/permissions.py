"""API permissions: every endpoint needs a signed-in user (session or token); actions need operators."""
from rest_framework.permissions import SAFE_METHODS, BasePermission

from dashboard.roles import can_operate


class OperatorForWrites(BasePermission):
    message = ("Only operators may act (start, stop, pause, resume, restart, rewind, reset a group): "
               "you have the viewer role.")

    def has_permission(self, request, view):
        return request.method in SAFE_METHODS or can_operate(request.user)
