"""Django's account URLs, with password reset only where email is configured (settings.EMAIL_CONFIGURED):
without a way to send the link, the reset form would only tell an attacker which addresses exist."""
from functools import wraps

from django.conf import settings
from django.contrib.auth import views
from django.http import Http404
from django.urls import path


def email_required(view):
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not settings.EMAIL_CONFIGURED:
            raise Http404("Password reset needs email, which is not configured.")
        return view(request, *args, **kwargs)

    return wrapped


urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("password_change/", views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("password_reset/", email_required(views.PasswordResetView.as_view()), name="password_reset"),
    path("password_reset/done/", email_required(views.PasswordResetDoneView.as_view()), name="password_reset_done"),
    path("reset/<uidb64>/<token>/", email_required(views.PasswordResetConfirmView.as_view()),
         name="password_reset_confirm"),
    path("reset/done/", email_required(views.PasswordResetCompleteView.as_view()), name="password_reset_complete"),
]
