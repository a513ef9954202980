"""API tokens (django-rest-knox): the database keeps only a digest of each token and its first characters (to
find it and name it masked), `POST /api/token` makes a new token at each call, shown in that answer only, and a
token lives TALLY_API_TOKEN_TTL_DAYS (0: for ever); an expired or revoked token is refused."""
import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test import Client
from knox.models import AuthToken

from consumers.models import ActionLog, ActionResult
from tests.test_production_settings import settings_value
from tests.views_helpers import PASSWORD, client_of, fresh_throttles, make_operator, make_viewer  # noqa: F401

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
    # GET never writes: the expired token stays (knox's own class deleted it, and the user's other expired tokens,
    # at any request) until its user is next given a token.
    assert AuthToken.objects.count() == 1
    with time_machine.travel(NOW + timedelta(days=30, seconds=2), tick=False):
        fresh = new_key(Client(), AuthToken.objects.get().user)["token"]
    assert list(AuthToken.objects.values_list("token_key", flat=True)) == [fresh[:15]]


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


# --- the action log, failed logins and the limit of live tokens ------------------------------------------------

def token_log():
    return ActionLog.objects.filter(action="make_token").order_by("pk")


def test_a_token_made_through_the_api_is_in_the_action_log_named_masked():
    key = new_key(Client(), make_operator())["token"]

    [entry] = token_log()
    assert entry.result == ActionResult.DONE and entry.actor == "otto"
    assert entry.params == {"via": "api", "user": "otto", "key": f"{key[:4]}…"}
    assert key[:15] not in json.dumps([entry.message, entry.params])   # never enough of it to find or use it


def test_a_refused_login_says_and_logs_the_same_whether_the_user_exists_is_inactive_or_not():
    make_operator()
    inactive = make_viewer()
    inactive.is_active = False
    inactive.save()
    client = Client()

    answers = [client.post("/api/token", {"username": name, "password": password})
               for name, password in (("otto", "wrong"), ("nobody", "wrong"), ("vera", PASSWORD))]

    assert {answer.status_code for answer in answers} == {400}
    assert answers[0].json() == answers[1].json() == answers[2].json()
    refusals = list(token_log())
    assert [entry.result for entry in refusals] == [ActionResult.REFUSED] * 3
    assert len({entry.message for entry in refusals}) == 1 and "credentials" in refusals[0].message
    # An account's name is kept (whom the failures aim at); other text may be a password typed in the wrong field
    assert [entry.params["username"] for entry in refusals] == ["otto", None, "vera"]
    assert {entry.actor for entry in refusals} == {"anonymous"}
    assert not AuthToken.objects.exists()


def test_a_login_locked_out_after_repeated_failures_is_refused_429_and_logged():
    make_operator()
    client = Client()
    statuses = [client.post("/api/token", {"username": "otto", "password": "wrong"}).status_code for _ in range(5)]
    locked = client.post("/api/token", {"username": "otto", "password": PASSWORD})

    assert statuses == [400] * 4 + [429] and locked.status_code == 429
    entries = list(token_log())
    assert [entry.result for entry in entries] == [ActionResult.REFUSED] * 6
    assert all("Too many failed logins" in entry.message for entry in entries[-2:])
    assert not AuthToken.objects.exists()


def test_a_user_with_as_many_live_tokens_as_the_limit_is_refused_409_until_one_expires_or_is_revoked(settings):
    settings.REST_KNOX = {**settings.REST_KNOX, "TOKEN_TTL": timedelta(days=30), "TOKEN_LIMIT_PER_USER": 2}
    operator, client = make_operator(), Client()
    with time_machine.travel(NOW, tick=False):
        new_key(client, operator)
    with time_machine.travel(NOW + timedelta(days=29), tick=False):
        second = new_key(client, operator)["token"]
        over = client.post("/api/token", {"username": "otto", "password": PASSWORD})
        assert over.status_code == 409
        assert "2 live API tokens" in over.json()["error"] and "TALLY_API_TOKEN_LIMIT" in over.json()["error"]
        refusal = ActionLog.objects.get(pk=over.json()["action_id"])
        assert refusal.result == ActionResult.REFUSED and refusal.actor == "otto"
        assert AuthToken.objects.filter(user=operator).count() == 2

        revoked = Client().delete("/api/token", HTTP_AUTHORIZATION=f"Token {second}")
        assert revoked.status_code == 204 and me(second).status_code in (401, 403)
        assert ActionLog.objects.get(action="revoke_token").params == {"via": "api", "user": "otto",
                                                                       "key": f"{second[:4]}…"}
        new_key(client, operator)   # one was revoked: room for one
    with time_machine.travel(NOW + timedelta(days=30, seconds=1), tick=False):
        new_key(client, operator)   # the first expired: it counts no more


def test_revoking_needs_a_token_to_revoke():
    response = client_of(make_operator()).delete("/api/token")
    assert response.status_code == 400 and "Authorization: Token" in response.json()["error"]
    assert ActionLog.objects.get(action="revoke_token").result == ActionResult.REFUSED


def test_the_limit_of_live_tokens_is_a_setting_and_zero_means_none():
    assert settings_value("REST_KNOX['TOKEN_LIMIT_PER_USER']") == "10"
    assert settings_value("REST_KNOX['TOKEN_LIMIT_PER_USER']", TALLY_API_TOKEN_LIMIT="3") == "3"
    assert settings_value("REST_KNOX['TOKEN_LIMIT_PER_USER']", TALLY_API_TOKEN_LIMIT="0") == "None"
