"""Request hygiene before any view runs.

NUL characters (`%00`) cannot be stored in or compared with PostgreSQL text: a query such as
`?pipeline=%00` made the database driver raise and the page answer 500. No legitimate input holds them,
so a request carrying one in its path, query string or form fields is refused with a 400 here.
"""
from django.http import HttpResponseBadRequest, JsonResponse

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
                return JsonResponse({"errors": {field: [MESSAGE]}}, status=400)
            return HttpResponseBadRequest(f"{MESSAGE} ({field})", content_type="text/plain")
        return self.get_response(request)
