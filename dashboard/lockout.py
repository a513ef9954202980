"""What a locked-out client sees (django-axes calls this after too many failed logins): a 429 with the
reason, as JSON for the API's token endpoint and as text elsewhere. Nothing about the account is told."""
import ipaddress

from axes.models import AccessAttempt
from django.conf import settings
from django.http import HttpResponse, JsonResponse
from rest_framework.throttling import BaseThrottle

from consumers.models.text import fit


def lockout_message() -> str:
    return f"Too many failed logins: try again in {round(settings.AXES_COOLOFF_TIME * 60)} minutes."


def locked_out(request, credentials=None, *args, **kwargs):
    message = lockout_message()
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message}, status=429)
    return HttpResponse(message, status=429, content_type="text/plain")


def client_username(request, credentials=None) -> str | None:
    """The user name django-axes records (AXES_USERNAME_CALLABLE): as given, made storable and cut to its
    column. A longer name than any account's can only fail, so the cut merges nothing that could log in."""
    field = settings.AXES_USERNAME_FORM_FIELD
    if credentials:
        name = credentials.get(field)
    else:
        data = getattr(request, "data", None)
        name = data.get(field) if isinstance(data, dict) else request.POST.get(field)
    return None if name is None else fit(AccessAttempt, "username", name)


def client_address(request) -> str | None:
    """The client's address django-axes records (AXES_CLIENT_IP_CALLABLE): the one the API's throttles key on
    (DRF's NUM_PROXIES, which is AXES_IPWARE_PROXY_COUNT), so X-Forwarded-For counts only behind that many
    proxies. Axes reads the proxy count only through django-ipware, which Tally does not install: without this,
    every client behind a proxy shared the proxy's address and one could lock the others out. An entry that is
    not an address (its column is inet) falls back to the socket's."""
    found = BaseThrottle().get_ident(request)
    try:
        return str(ipaddress.ip_address(found))
    except ValueError:
        return request.META.get("REMOTE_ADDR")
