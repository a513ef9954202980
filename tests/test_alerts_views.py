"""The alerts page and its JSON API: everyone signed in sees, operators act, viewers get 403."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from alerts.models import Alert, AlertRule, AlertState, Mute, RuleKind
from consumers.models import Pipeline


@pytest.fixture
def operator(db):
    user = User.objects.create_user("olga", password="pw-olga-123")
    user.user_permissions.add(Permission.objects.get(codename="operate_pipeline"))
    return user


@pytest.fixture
def viewer(db):
    user = User.objects.create_user("victor", password="pw-victor-123")
    user.user_permissions.add(Permission.objects.get(codename="view_pipeline"))
    return user


def client_for(user, **kwargs):
    client = Client(**kwargs)
    client.force_login(user)
    return client


def make_alert(name, state=AlertState.FIRING, summary="3 lost records (partition 0: offsets 1-3)"):
    pipeline = Pipeline.objects.get_or_create(name=name, defaults={"topic": name, "sink_table": name})[0]
    rule = AlertRule.objects.get_or_create(name=f"{name} loss", kind=RuleKind.LOST, pipeline=pipeline)[0]
    now = timezone.now()
    return Alert.objects.create(rule=rule, pipeline=pipeline, state=state, summary=summary, facts={"count": 3},
                                started_at=now, last_seen_at=now,
                                resolved_at=now if state == AlertState.RESOLVED else None)


def test_the_page_lists_open_alerts_and_filters_by_state_and_pipeline(viewer):
    make_alert("orders")
    make_alert("payments", summary="lag 900 records > 500")
    old = make_alert("refunds", state=AlertState.RESOLVED, summary="resolved thing")
    client = client_for(viewer)

    page = client.get("/alerts/").content.decode()
    assert "3 lost records" in page and "lag 900 records" in page and "resolved thing" not in page

    only_payments = client.get("/alerts/", {"pipeline": "payments"}).content.decode()
    assert "lag 900 records" in only_payments and "3 lost records" not in only_payments

    resolved = client.get("/alerts/", {"state": "resolved"}).content.decode()
    assert f'id="alert-{old.pk}"' in resolved and "lag 900 records" not in resolved


def test_an_htmx_filter_request_gets_only_the_table(viewer):
    make_alert("orders")
    response = client_for(viewer).get("/alerts/", {"state": "all"}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="alert-table"') and "<html" not in body
    assert "HX-Request" in response["Vary"]


def test_a_viewer_sees_no_action_buttons_and_cannot_acknowledge_or_mute(viewer):
    alert = make_alert("orders")
    client = client_for(viewer)
    assert "Acknowledge" not in client.get("/alerts/").content.decode()

    assert client.post(f"/alerts/{alert.pk}/acknowledge/").status_code == 403
    assert client.post(f"/alerts/{alert.pk}/mute/", {"minutes": 60}).status_code == 403
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING and not Mute.objects.exists()


def test_an_operator_acknowledges_from_the_page_without_javascript(operator):
    alert = make_alert("orders")
    client = client_for(operator, enforce_csrf_checks=True)
    page = client.get("/alerts/")
    assert "Acknowledge" in page.content.decode()
    token = page.cookies["csrftoken"].value

    response = client.post(f"/alerts/{alert.pk}/acknowledge/", {"csrfmiddlewaretoken": token, "next": "/alerts/"})

    assert response.status_code == 302 and response["Location"] == "/alerts/"
    alert.refresh_from_db()
    assert (alert.state, alert.acknowledged_by) == (AlertState.ACKNOWLEDGED, "olga")
    assert "Acknowledged: orders" in client.get("/alerts/").content.decode()


def test_a_form_post_without_a_csrf_token_is_refused(operator):
    alert = make_alert("orders")
    response = client_for(operator, enforce_csrf_checks=True).post(f"/alerts/{alert.pk}/acknowledge/")
    assert response.status_code == 403
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING


def test_an_operator_mutes_an_alerts_rule_for_its_pipeline(operator):
    alert = make_alert("orders")
    before = timezone.now()
    response = client_for(operator).post(f"/alerts/{alert.pk}/mute/", {"minutes": "240", "reason": "deploy"})
    assert response.status_code == 302
    mute = Mute.objects.get()
    assert (mute.rule, mute.pipeline, mute.created_by, mute.reason) == (alert.rule, alert.pipeline, "olga", "deploy")
    assert before + timedelta(minutes=240) <= mute.until <= timezone.now() + timedelta(minutes=240)
    page = client_for(operator).get("/alerts/").content.decode()
    assert f"muted until {mute.until:%Y-%m-%d %H:%M}" in page and "deploy" in page


def test_the_page_redirects_anonymous_users_to_login(db):
    response = Client().get("/alerts/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_api_lists_alerts_with_filters(viewer):
    make_alert("orders")
    make_alert("payments", state=AlertState.RESOLVED)
    client = client_for(viewer)

    open_alerts = client.get("/api/alerts/").json()["alerts"]
    assert [(a["pipeline"], a["state"], a["kind"]) for a in open_alerts] == [("orders", "firing", "lost")]
    everything = client.get("/api/alerts/", {"state": "all"}).json()["alerts"]
    assert sorted(a["pipeline"] for a in everything) == ["orders", "payments"]
    payments = client.get("/api/alerts/", {"state": "all", "pipeline": "payments"}).json()["alerts"]
    assert [a["state"] for a in payments] == ["resolved"]


def test_the_api_refuses_actions_by_viewers_and_everything_to_anonymous_users(viewer):
    alert = make_alert("orders")
    client = client_for(viewer)
    assert client.post(f"/api/alerts/{alert.pk}/acknowledge/").status_code == 403
    assert client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": 5}).status_code == 403
    assert Client().get("/api/alerts/").status_code in (401, 403)
    assert Client().post(f"/api/alerts/{alert.pk}/acknowledge/").status_code in (401, 403)
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING


def test_the_api_acknowledges_once_and_mutes(operator):
    alert = make_alert("orders")
    client = client_for(operator)

    first = client.post(f"/api/alerts/{alert.pk}/acknowledge/")
    second = client.post(f"/api/alerts/{alert.pk}/acknowledge/")
    muted = client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": 30, "reason": "rewinding"},
                        content_type="application/json")
    invalid = client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": "forever"}, content_type="application/json")

    assert first.status_code == 200 and first.json()["alert"]["acknowledged_by"] == "olga"
    assert second.status_code == 409
    assert muted.status_code == 200 and muted.json()["mute"]["pipeline"] == "orders"
    assert invalid.status_code == 400
    assert Mute.objects.get().reason == "rewinding"
    detail = client.get(f"/api/alerts/{alert.pk}/").json()
    assert detail["state"] == "acknowledged" and detail["notifications"] == []


def test_a_script_acknowledges_with_a_token(operator):
    from rest_framework.authtoken.models import Token

    alert = make_alert("orders")
    token = Token.objects.create(user=operator)
    response = Client().post(f"/api/alerts/{alert.pk}/acknowledge/", headers={"Authorization": f"Token {token.key}"})
    assert response.status_code == 200 and response.json()["alert"]["state"] == "acknowledged"
