"""API tokens (django-rest-knox): the database keeps only a digest of each token and its first characters (to
find it and name it masked), `POST /api/token` makes a new token at each call, shown in that answer only, and a
token lives TALLY_API_TOKEN_TTL_DAYS (0: for ever); an expired or revoked token is refused."""
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test import Client
from knox.models import AuthToken

from tests.test_production_settings import settings_value
from tests.views_helpers import PASSWORD, make_operator

pytestmark = pytest.mark.django_db

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


def new_key(client: Client, user) -> dict:
    response = client.post("/api/token", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 200, response.content
    return response.json()


def me(key: str):
    return Client().get("/api/me", HTTP_AUTHORIZATION=f"Token {key}")


def test_a_token_is_stored_only_as_a_digest():
    answer = new_key(Client(), make_operator())
    key = answer["token"]
    assert me(key).status_code == 200
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        [row] = cursor.fetchall()
    assert key not in [str(value) for value in row]
    assert not any(str(value) in key for value in row if str(value) and len(str(value)) > 15)
    assert AuthToken.objects.get().token_key == key[:15]   # how it is found and named, not enough to use it


def test_each_post_makes_a_new_token_and_both_work():
    operator, client = make_operator(), Client()
    first, second = new_key(client, operator)["token"], new_key(client, operator)["token"]
    assert first != second and AuthToken.objects.filter(user=operator).count() == 2
    assert me(first).status_code == 200 and me(second).status_code == 200


def test_a_token_expires_after_the_configured_days_and_is_refused_then(settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": timedelta(days=30)}
    with time_machine.travel(NOW, tick=False):
        answer = new_key(Client(), make_operator())
        assert answer["expiry"].startswith("2030-01-31T12:00:00")
    with time_machine.travel(NOW + timedelta(days=30) - timedelta(seconds=1), tick=False):
        assert me(answer["token"]).status_code == 200
    with time_machine.travel(NOW + timedelta(days=30, seconds=1), tick=False):
        refused = me(answer["token"])
    assert refused.status_code in (401, 403) and "Invalid token" in refused.content.decode()
    assert not AuthToken.objects.exists()   # knox deletes an expired token when it is refused


def test_with_no_time_to_live_a_token_never_expires(settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": None}
    with time_machine.travel(NOW, tick=False):
        answer = new_key(Client(), make_operator())
    assert answer["expiry"] is None
    with time_machine.travel(NOW + timedelta(days=3650), tick=False):
        assert me(answer["token"]).status_code == 200


def test_a_revoked_token_is_refused_and_the_others_keep_working():
    operator, client = make_operator(), Client()
    revoked, kept = new_key(client, operator)["token"], new_key(client, operator)["token"]
    AuthToken.objects.get(token_key=revoked[:15]).delete()
    refused = me(revoked)
    assert refused.status_code in (401, 403) and "Invalid token" in refused.content.decode()
    assert me(kept).status_code == 200


def test_the_time_to_live_is_a_setting_in_days_and_zero_means_for_ever():
    assert settings_value("REST_KNOX['TOKEN_TTL']") == str(timedelta(days=90))
    assert settings_value("REST_KNOX['TOKEN_TTL']", TALLY_API_TOKEN_TTL_DAYS="7") == str(timedelta(days=7))
    assert settings_value("REST_KNOX['TOKEN_TTL']", TALLY_API_TOKEN_TTL_DAYS="0") == "None"
