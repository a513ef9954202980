"""Inputs that once answered 500: over-long user names, deeply nested or unstorable JSON, loose alert bodies,
long group ids, transforms that fail to import; and requests that answered 4xx after acting. Each now gets a
clear 4xx, and nothing changes but the refusal's own row in the action log."""
import json
from datetime import UTC, datetime

import pytest
import time_machine
from axes.models import AccessAttempt
from django.test import Client

from alerts.models import Alert, AlertState, Mute
from consumers.models import ActionLog, ActionResult, DeadLetter, DesiredState, PartitionOffset, Pipeline
from tests.alert_rows import open_alert
from tests.views_helpers import PASSWORD, fresh_throttles, make_operator, make_pipeline  # noqa: F401 - autouse fixture

DEEP = "[" * 100_000 + "]" * 100_000
SURROGATE_KEY = '{"mode": "to-earliest", "\\ud800": 1}'


@pytest.fixture
def orders(db):
    pipeline = make_pipeline()
    return pipeline, offsets_of(pipeline)


def offsets_of(pipeline) -> dict:
    return dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))


def assert_nothing_changed(pipeline, offsets):
    assert offsets_of(pipeline) == offsets
    assert not ActionLog.objects.exclude(result=ActionResult.REFUSED).exists()
    assert Pipeline.objects.get(pk=pipeline.pk).desired_state == DesiredState.STOPPED
    assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()


WRITE_URLS = ["/api/pipelines/orders/rewind", "/api/pipelines/orders/actions/start",
              "/api/groups/billing/reset", "/api/pipelines/orders/reconciliation",
              "/api/pipelines/orders/topic-checks", "/api/pipelines/orders/dead-letters/replay",
              "/api/pipelines/orders/dead-letters/discard"]


@pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/", "/api/token"])
def test_a_user_name_longer_than_the_lockout_column_is_a_failed_login_not_a_500(db, url):
    response = Client().post(url, {"username": "u" * 300, "password": "wrong"})
    assert response.status_code in (200, 400), response.content[:300]
    attempt = AccessAttempt.objects.get()
    assert attempt.username == "u" * 255  # recorded, cut to its column: the lockout still counts it


def test_a_user_name_holding_a_nul_or_a_surrogate_is_refused_by_the_token_endpoint(db):
    for name in ("a\x00b", "a\ud800b"):
        body = json.dumps({"username": name, "password": "x"})
        response = Client().post("/api/token", body, content_type="application/json")
        assert response.status_code == 400, response.content
    assert not AccessAttempt.objects.exists()


def test_deeply_nested_json_on_the_token_endpoint_is_a_400(db):
    response = Client().post("/api/token", DEEP, content_type="application/json")
    assert response.status_code == 400 and "deeper" in response.json()["detail"]


@pytest.mark.parametrize("url", WRITE_URLS + ["/api/alerts/ALERT/mute/", "/api/alerts/ALERT/acknowledge/"])
@pytest.mark.parametrize("body", [DEEP, '{"a":' * 40 + "1" + "}" * 40, SURROGATE_KEY,
                                  '{"filter": {"\\ud800": 1}, "count": 1}', '{"reason": "a\\u0000b", "ids": [1]}',
                                  '{"reason": "\\udfff"}'])
def test_nested_and_unstorable_bodies_are_400s_on_every_write_endpoint(operator_client, orders, url, body):
    pipeline, offsets = orders
    alert = open_alert(pipeline)
    response = operator_client.post(url.replace("ALERT", str(alert.pk)), body, content_type="application/json")
    assert response.status_code == 400, (url, response.content[:300])
    answer = response.json()
    assert "deeper than 32 levels" in answer.get("detail", "") or "cannot be stored" in str(answer["errors"])
    assert_nothing_changed(pipeline, offsets)
    assert not Mute.objects.exists()
    assert Alert.objects.get().state == AlertState.FIRING


def test_a_body_over_the_size_limit_is_a_413(operator_client, orders, settings):
    pipeline, offsets = orders
    settings.TALLY_MAX_BODY_BYTES = 2048
    body = json.dumps({"ids": list(range(1, 1000)), "reason": "too big"})
    response = operator_client.post("/api/pipelines/orders/dead-letters/discard", body, content_type="application/json")
    assert response.status_code == 413 and "2048 bytes" in response.json()["detail"]
    assert_nothing_changed(pipeline, offsets)


@pytest.mark.parametrize("body", ["null", "[]", '"x"', "123", "true", '{"minutes": 1.9}', '{"minutes": true}',
                                  '{"minutes": "10"}', '{"minutes": 0}', '{"minutes": 43201}', '{"reason": 5}',
                                  '{"minutes": 10, "extra": 1}', '{"reason": "' + "r" * 201 + '"}'])
def test_a_mute_with_a_loose_body_is_a_400_naming_the_problem(operator_client, orders, body):
    pipeline, offsets = orders
    alert = open_alert(pipeline)
    response = operator_client.post(f"/api/alerts/{alert.pk}/mute/", body, content_type="application/json")
    assert response.status_code == 400, (body, response.content)
    assert "errors" in response.json()
    assert not Mute.objects.exists()
    refusal = ActionLog.objects.get(result=ActionResult.REFUSED)
    assert refusal.action == "mute_alert" and refusal.actor == "otto"


def test_a_good_mute_still_mutes(operator_client, orders):
    pipeline, _ = orders
    alert = open_alert(pipeline)
    response = operator_client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": 5, "reason": "deploy"},
                                    content_type="application/json")
    assert response.status_code == 200, response.content
    assert Mute.objects.get().reason == "deploy"


@pytest.mark.parametrize("body,content_type", [("x", "text/plain"), ('{"now": true}', "application/json"),
                                               ("[]", "application/json")])
def test_acknowledge_takes_no_body_but_an_empty_object(operator_client, orders, body, content_type):
    pipeline, _ = orders
    alert = open_alert(pipeline)
    response = operator_client.post(f"/api/alerts/{alert.pk}/acknowledge/", body, content_type=content_type)
    assert 400 <= response.status_code < 500, response.content
    assert Alert.objects.get().acknowledged_at is None


def test_a_mute_reason_longer_than_its_column_is_refused_on_the_page(operator_client, orders):
    pipeline, _ = orders
    alert = open_alert(pipeline)
    response = operator_client.post(f"/alerts/{alert.pk}/mute/", {"minutes": "5", "reason": "r" * 201})
    assert response.status_code == 302
    assert not Mute.objects.exists()
    assert ActionLog.objects.get(result=ActionResult.REFUSED).action == "mute_alert"


@pytest.mark.parametrize("door", ["api", "page"])
def test_a_group_id_longer_than_its_column_is_refused_and_audited(operator_client, orders, door):
    group = "g" * 300
    if door == "api":
        response = operator_client.post(f"/api/groups/{group}/reset", {"topic": "t", "mode": "to-earliest"},
                                        content_type="application/json")
        assert response.status_code == 409, response.content
    else:
        response = operator_client.post(f"/groups/{group}/reset/", {"topic": "t", "mode": "to-earliest",
                                                                    "step": "preview"})
        assert response.status_code == 422, response.content[:300]
    refusal = ActionLog.objects.get()
    assert refusal.result == ActionResult.REFUSED and refusal.group_id == "g" * 255
    assert "at most 255" in refusal.message


def test_a_group_id_longer_than_its_column_is_refused_in_the_admin(db):
    from django.contrib.auth.models import User

    admin = User.objects.create_superuser("root", password=PASSWORD)
    client = Client()
    client.force_login(admin)
    response = client.post("/admin/consumers/groups/reset/", {"group": "g" * 300, "topic": "t", "mode": "to-earliest",
                                                               "step": "preview"})
    assert response.status_code == 200 and "at most 255" in response.content.decode()
    assert ActionLog.objects.get().result == ActionResult.REFUSED


@pytest.mark.kafka  # the form checks the topic too: a real one, so the transform is the only problem
@pytest.mark.parametrize("transform", ["django.contrib.gis.gdal.x", "..x", ".x", "consumers..x"])
def test_a_transform_that_fails_to_import_is_a_form_error(operator_client, make_topic, transform):
    response = operator_client.post("/pipelines/new/", {"name": "p1", "topic": make_topic("tr"),
                                                        "sink_table": "sink_p1", "transform": transform,
                                                        "mode": "exactly-once", "isolation_level": "read_committed",
                                                        "engine": "python", "on_log_truncated": "stop"})
    assert response.status_code == 400, response.content[:300]
    assert "Cannot import transform" in response.content.decode() or "Unknown transform" in response.content.decode()
    assert not Pipeline.objects.exists()
    refusal = ActionLog.objects.get()
    assert (refusal.action, refusal.result, refusal.params) == ("create", ActionResult.REFUSED, {"pipeline": "p1"})


@pytest.mark.parametrize("action,fields", [
    ("discard", {"ids": "DL", "reason": "probe", "offset_from": "x"}),
    ("discard", {"ids": "DL", "reason": "probe", "partition": "abc"}),
    ("discard", {"ids": "DL", "reason": "probe", "offset_from": "5", "offset_to": "1"}),
    ("replay", {"ids": "DL", "partition": "abc"}),
    ("replay", {"ids": "DL", "offset_to": "-1"}),
    ("replay", {"ids": "DL", "state": "nonsense"}),
])
def test_a_dead_letter_action_with_a_bad_carried_filter_changes_nothing(operator_client, orders, action, fields):
    pipeline, offsets = orders
    letter = DeadLetter.objects.get(pipeline=pipeline)
    response = operator_client.post(f"/pipelines/orders/dead-letters/{action}/",
                                    {k: str(letter.pk) if v == "DL" else v for k, v in fields.items()})
    assert response.status_code == 422
    letter.refresh_from_db()
    assert letter.discarded_at is None and letter.replay_attempts == 0
    assert DeadLetter.objects.filter(pipeline=pipeline).count() == 1
    assert_nothing_changed(pipeline, offsets)
    assert ActionLog.objects.get().result == ActionResult.REFUSED


@pytest.fixture
def still_clock():
    """Each attempt hashes a password: on a busy machine twelve can outlast the throttle's minute."""
    with time_machine.travel(datetime(2030, 1, 1, 12, tzinfo=UTC), tick=False):
        yield


def test_made_up_forwarded_for_headers_change_no_throttle(db, still_clock):
    client = Client()
    statuses = [client.post("/api/token", {"username": f"nobody{i}", "password": "x"},
                            headers={"X-Forwarded-For": f"10.0.0.{i}"}).status_code for i in range(12)]
    assert statuses[:10] == [400] * 10 and statuses[10:] == [429, 429]


def test_behind_one_trusted_proxy_the_throttle_keys_on_the_address_it_forwards(db, settings, still_clock):
    from rest_framework.settings import api_settings

    assert api_settings.NUM_PROXIES == settings.AXES_IPWARE_PROXY_COUNT == 0  # one setting drives both
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    client = Client()
    one_client = [client.post("/api/token", {"username": f"x{i}", "password": "x"},
                              headers={"X-Forwarded-For": "10.0.0.1"}).status_code for i in range(11)]
    assert one_client == [400] * 10 + [429]
    other = client.post("/api/token", {"username": "y", "password": "x"}, headers={"X-Forwarded-For": "10.0.0.2"})
    assert other.status_code == 400  # another client behind the same proxy is not throttled by the first


def test_behind_one_trusted_proxy_a_lockout_keys_on_the_address_it_forwards(db, settings):
    """The proxy appends the client's address to X-Forwarded-For: a made-up address before it changes nothing,
    and another client behind the same proxy is not locked out by the first one's failures."""
    settings.AXES_IPWARE_PROXY_COUNT = 1
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    make_operator()
    client = Client()
    failures = [client.post("/accounts/login/", {"username": "otto", "password": "wrong"},
                            headers={"X-Forwarded-For": f"6.6.6.{i}, 10.0.0.1"}).status_code for i in range(5)]
    assert failures == [200] * 4 + [429]
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"10.0.0.1"}
    other = Client().post("/accounts/login/", {"username": "otto", "password": PASSWORD},
                          headers={"X-Forwarded-For": "10.0.0.2"})
    assert other.status_code == 302


def test_a_forwarded_address_that_is_not_an_address_is_a_failed_login_not_a_500(db, settings):
    settings.AXES_IPWARE_PROXY_COUNT = 1
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    answer = Client().post("/accounts/login/", {"username": "otto", "password": "wrong"},
                           headers={"X-Forwarded-For": "not-an-address"})
    assert answer.status_code == 200
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == ["127.0.0.1"]


def test_the_throttle_counts_follow_the_lockout_setting(monkeypatch):
    """NUM_PROXIES is read from AXES_IPWARE_PROXY_COUNT when the settings load."""
    import importlib

    import tally.settings

    monkeypatch.setenv("AXES_IPWARE_PROXY_COUNT", "2")
    try:
        reloaded = importlib.reload(tally.settings)
        assert reloaded.REST_FRAMEWORK["NUM_PROXIES"] == 2 == reloaded.AXES_IPWARE_PROXY_COUNT
    finally:
        monkeypatch.delenv("AXES_IPWARE_PROXY_COUNT")
        importlib.reload(tally.settings)


def test_an_operator_can_still_log_in_after_the_changes(db):
    make_operator()
    assert Client().post("/accounts/login/", {"username": "otto", "password": PASSWORD}).status_code == 302


@pytest.mark.parametrize("body", ["{", DEEP, '{"name": "a\\u0000b"}'], ids=["unclosed", "deep", "nul"])
def test_a_bad_body_from_a_signed_in_browser_is_a_400_and_audited_not_a_500(db, body):
    """A session's CSRF check reads the body's form fields: it once parsed the bad body again from inside the
    parser's refusal, until RecursionError. The test client skips that check unless asked (enforce_csrf_checks)."""
    make_pipeline()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())
    client.get("/")   # sets the CSRF cookie, as the dashboard does for its own scripts
    token = client.cookies["csrftoken"].value
    for url in ("/api/watches/", "/api/pipelines/orders/actions/start", "/api/pipelines/preview"):
        response = client.post(url, body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
        assert response.status_code == 400, (url, response.status_code, response.content[:200])
    refused = ActionLog.objects.filter(result=ActionResult.REFUSED, actor="otto")
    assert refused.count() == 3 and all(r.message.startswith("bad input: ") for r in refused)
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED
    without_token = client.post("/api/watches/", body, content_type="application/json")
    assert without_token.status_code == 403 and "CSRF" in without_token.json()["detail"]
