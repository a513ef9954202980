"""What a locked-out client sees (django-axes calls this after too many failed logins): a 429 with the
reason, as JSON for the API's token endpoint and as text elsewhere. Nothing about the account is told."""
from django.conf import settings
from django.http import HttpResponse, JsonResponse


def locked_out(request, credentials=None, *args, **kwargs):
    minutes = round(settings.AXES_COOLOFF_TIME * 60)
    message = f"Too many failed logins: try again in {minutes} minutes."
    if request.path.startswith("/api/"):
        return JsonResponse({"error": message}, status=429)
    return HttpResponse(message, status=429, content_type="text/plain")
