"""API tokens (django-rest-knox's): made by `POST /api/token` and revoked by `DELETE /api/token`, each in the
action log naming the token masked. A user holds at most TALLY_API_TOKEN_LIMIT live tokens (knox's
TOKEN_LIMIT_PER_USER), so a script asking for a new token at every run, or a leaked password, cannot pile up
tokens that work for months."""
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from knox import auth as knox_auth
from knox.models import AuthToken
from knox.settings import knox_settings
from rest_framework.exceptions import AuthenticationFailed

from consumers.access import actor_of, record_refusal
from consumers.models import ActionLog, ActionResult
from consumers.operations.errors import Refused

SHOWN_CHARS = 4


def masked(key: str) -> str:
    return f"{key[:SHOWN_CHARS]}…" if key else ""


class TokenAuthentication(knox_auth.TokenAuthentication):
    """knox's, refusing a key that is not printable ASCII as an invalid token (knox's keys are hex): knox decodes
    the key as UTF-8, and a header's Latin-1 bytes, or a NUL PostgreSQL cannot compare, were a 500 to anyone."""

    def authenticate_credentials(self, token: bytes):
        if not token.isascii() or not token.decode().isprintable():
            raise AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)

    def _cleanup_token(self, auth_token) -> bool:
        """Whether `auth_token` has expired (then it is refused). knox also deletes it, and the user's other expired
        tokens, at any request: GET never writes, so they go when the user is next given a token (issue)."""
        return auth_token.expiry is not None and auth_token.expiry < timezone.now()


class TokenScheme(KnoxTokenScheme):
    """The OpenAPI schema's security scheme of TokenAuthentication: knox's, under its name (registered by being
    defined; this module is imported wherever the class is)."""

    target_class = TokenAuthentication


class TooManyTokens(Refused):
    """The user holds as many live tokens as allowed; `action_log` is the refusal's entry."""


def live_tokens(user):
    now = timezone.now()
    return AuthToken.objects.filter(user=user).filter(Q(expiry__gt=now) | Q(expiry__isnull=True))


def issue(user) -> tuple[AuthToken, str]:
    """A new token of `user` and its key (known only now), logged; TooManyTokens when the user is at the limit."""
    limit = knox_settings.TOKEN_LIMIT_PER_USER
    username = user.get_username()
    with transaction.atomic():
        # The user's row is locked: two requests at once cannot both take the last free place.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        AuthToken.objects.filter(user=user, expiry__lte=timezone.now()).delete()   # expired: of no use to anyone
        held = live_tokens(user).count()
        if limit is None or held < limit:
            token, key = AuthToken.objects.create(user=user, expiry=knox_settings.TOKEN_TTL)
            _log("make_token", user, token, f"made the API token {masked(key)} of {username}")
            return token, key
    # Recorded outside the transaction, which made nothing.
    refusal = TooManyTokens(f"{username} has {held} live API tokens, the most allowed (TALLY_API_TOKEN_LIMIT="
                            f"{limit}): revoke one (DELETE /api/token with it, or in the admin) or wait until one "
                            "expires.")
    refusal.action_log = record_refusal(user, "make_token", str(refusal), params={"via": "api", "user": username})
    raise refusal


def revoke(token: AuthToken, actor) -> None:
    """Delete `token` (it stops working at once), logged."""
    owner = token.user.get_username()
    with transaction.atomic():
        token.delete()
        _log("revoke_token", actor, token, f"revoked the API token {masked(token.token_key)} of {owner}")


def _log(action: str, actor, token: AuthToken, message: str) -> None:
    ActionLog.objects.create(action=action, actor=actor_of(actor), result=ActionResult.DONE, message=message,
                             params={"via": "api", "user": token.user.get_username(),
                                     "key": masked(token.token_key)},
                             finished_at=timezone.now())
