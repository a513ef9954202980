"""Request hygiene before any view runs: NUL characters refused, and users without a role stopped.

NUL characters (`%00`) cannot be stored in or compared with PostgreSQL text: a query such as
`?pipeline=%00` made the database driver raise and the page answer 500. No legitimate input holds them,
so a request carrying one in its path, query string or form fields is refused with a 400 here.
"""
from django.http import HttpResponseBadRequest, JsonResponse
from django.shortcuts import render

from consumers.access import can_view, record_refusal
from dashboard.views.common import htmx_bad_request

MESSAGE = "The request holds a NUL character (%00), which no field accepts."


def _has_nul(querydict) -> str | None:
    for key, values in querydict.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            return key.replace("\x00", "\\x00")
    return None


class RejectNulCharactersMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        field = None
        if "\x00" in request.path:
            field = "path"
        else:
            field = _has_nul(request.GET)
            if field is None and request.method == "POST" and request.content_type in (
                    "application/x-www-form-urlencoded", "multipart/form-data"):
                field = _has_nul(request.POST)
        if field is not None:
            if request.path.startswith("/api/"):
                return JsonResponse({"errors": {field: [{"message": MESSAGE, "code": "null_characters"}]}}, status=400)
            if request.headers.get("HX-Request"):  # htmx swaps 400s: the reason, not plain text in the target
                return htmx_bad_request(f"{MESSAGE} ({field})")
            return HttpResponseBadRequest(f"{MESSAGE} ({field})", content_type="text/plain")
        return self.get_response(request)


# Open to a signed-in user without a role: signing out and changing one's password, static files and the admin
# (which checks its own permissions). The API's permission classes check token users too (HasRole).
ROLE_FREE_PREFIXES = ("/accounts/", "/static/", "/favicon.ico", "/admin/")
NO_ROLE = "Your account has no role: ask an administrator for the viewers or operators role."


class RequireRoleMiddleware:
    """A signed-in user in neither role (viewers, operators) sees only a page saying so, with a 403; every
    such refusal is audited. Anonymous users go on to the login page as before."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and not request.path.startswith(ROLE_FREE_PREFIXES) \
                and not can_view(user):
            record_refusal(user, "view", "no role: the account is neither a viewer nor an operator",
                           params={"path": request.path, "method": request.method})
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": NO_ROLE}, status=403)
            return render(request, "no_role.html", status=403)
        return self.get_response(request)
