"""Template context every page needs."""
from django.conf import settings


def security(request):
    # The login page offers password reset only when a reset link can be sent.
    return {"email_configured": settings.EMAIL_CONFIGURED}
