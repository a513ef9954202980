"""The alerts page and its JSON API: everyone signed in sees, operators act, viewers get 403."""
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from alerts import evaluate
from alerts.models import Alert, AlertRule, AlertState, Mute, Notification, RuleKind
from alerts.rules import Finding
from consumers.models import ActionLog, Pipeline, Watch
from tests.alert_rows import open_alert
from tests.views_helpers import api_token


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


def test_the_page_lists_open_alerts_and_filters_by_state_and_pipeline(viewer):
    open_alert("orders")
    open_alert("payments", summary="lag 900 records > 500")
    old = open_alert("refunds", state=AlertState.RESOLVED, summary="resolved thing")
    client = client_for(viewer)

    page = client.get("/alerts/").content.decode()
    assert "3 lost records" in page and "lag 900 records" in page and "resolved thing" not in page

    only_payments = client.get("/alerts/", {"pipeline": "payments"}).content.decode()
    assert "lag 900 records" in only_payments and "3 lost records" not in only_payments

    resolved = client.get("/alerts/", {"state": "resolved"}).content.decode()
    assert f'id="alert-{old.pk}"' in resolved and "lag 900 records" not in resolved


def test_an_htmx_filter_request_gets_only_the_table(viewer):
    open_alert("orders")
    response = client_for(viewer).get("/alerts/", {"state": "all"}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="alert-table"') and "<html" not in body
    assert "HX-Request" in response["Vary"]


def test_a_viewer_sees_no_action_buttons_and_cannot_acknowledge_or_mute(viewer):
    alert = open_alert("orders")
    client = client_for(viewer)
    assert "Acknowledge" not in client.get("/alerts/").content.decode()

    refused = client.post(f"/alerts/{alert.pk}/acknowledge/")
    assert refused.status_code == 403
    page = refused.content.decode()   # the site's page, saying why (not Django's bare "403 Forbidden")
    assert 'id="refusal"' in page and "Only operators" in page and 'href="/"' in page
    assert client.post(f"/alerts/{alert.pk}/mute/", {"minutes": 60}).status_code == 403
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING and not Mute.objects.exists()


def test_an_operator_acknowledges_from_the_page_without_javascript(operator):
    alert = open_alert("orders")
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
    alert = open_alert("orders")
    response = client_for(operator, enforce_csrf_checks=True).post(f"/alerts/{alert.pk}/acknowledge/")
    assert response.status_code == 403
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING


def test_an_operator_mutes_an_alerts_rule_for_its_pipeline(operator):
    alert = open_alert("orders")
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
    open_alert("orders")
    open_alert("payments", state=AlertState.RESOLVED)
    client = client_for(viewer)

    open_alerts = client.get("/api/alerts/").json()["alerts"]
    assert [(a["pipeline"], a["state"], a["kind"]) for a in open_alerts] == [("orders", "firing", "lost")]
    everything = client.get("/api/alerts/", {"state": "all"}).json()["alerts"]
    assert sorted(a["pipeline"] for a in everything) == ["orders", "payments"]
    payments = client.get("/api/alerts/", {"state": "all", "pipeline": "payments"}).json()["alerts"]
    assert [a["state"] for a in payments] == ["resolved"]


def test_an_unknown_state_filter_is_refused_not_read_as_open(viewer):
    open_alert("orders")
    client = client_for(viewer)

    api = client.get("/api/alerts/", {"state": "bogus"})
    assert api.status_code == 400
    assert api.json()["errors"]["state"][0]["code"] == "invalid_choice"
    assert client.get("/api/alerts/", {"pipeline": "x" * 101}).status_code == 400

    page = client.get("/alerts/", {"state": "bogus"})
    body = page.content.decode()
    assert page.status_code == 400
    assert "Unknown state &#x27;bogus&#x27;: choose one of open, firing" in body
    assert "3 lost records" not in body


def test_the_alert_list_documents_its_filters_in_the_schema(viewer):
    schema = client_for(viewer).get("/api/schema/", headers={"Accept": "application/json"}).json()
    parameters = {p["name"]: p for p in schema["paths"]["/api/alerts/"]["get"]["parameters"]}
    assert set(parameters) == {"state", "pipeline"}
    assert "bogus" not in parameters["state"]["schema"]["enum"] and "all" in parameters["state"]["schema"]["enum"]


def test_the_api_refuses_actions_by_viewers_and_everything_to_anonymous_users(viewer):
    alert = open_alert("orders")
    client = client_for(viewer)
    assert client.post(f"/api/alerts/{alert.pk}/acknowledge/").status_code == 403
    assert client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": 5}).status_code == 403
    assert Client().get("/api/alerts/").status_code in (401, 403)
    assert Client().post(f"/api/alerts/{alert.pk}/acknowledge/").status_code in (401, 403)
    alert.refresh_from_db()
    assert alert.state == AlertState.FIRING


def test_the_api_acknowledges_once_and_mutes(operator):
    alert = open_alert("orders")
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
    log = ActionLog.objects.filter(action="acknowledge_alert").order_by("pk")
    assert [entry.result for entry in log] == ["done", "refused"]   # the 409 is a refusal in the log too
    assert "is acknowledged, not firing" in log[1].message
    detail = client.get(f"/api/alerts/{alert.pk}/").json()
    assert detail["state"] == "acknowledged" and detail["notifications"] == []


def test_a_script_acknowledges_with_a_token(operator):
    alert = open_alert("orders")
    key = api_token(operator)
    response = Client().post(f"/api/alerts/{alert.pk}/acknowledge/", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200 and response.json()["alert"]["state"] == "acknowledged"


def make_watch_alert(name, rule_kind=RuleKind.LOST):
    watch = Watch.objects.create(name=name, group_id=f"team-{name}", topic=name)
    return open_alert(watch, kind=rule_kind, summary=f"{name}: 2 lost records")


def test_a_watchs_alert_links_to_its_watch_filters_by_its_name_and_is_muted_for_that_watch_only(operator):
    alert, other = make_watch_alert("billing"), make_watch_alert("shipping")
    orders = open_alert("orders")
    client = client_for(operator)

    page = client.get("/alerts/").content.decode()
    row = page[page.index(f'id="alert-{alert.pk}"'):].split("</tr>")[0]
    assert '<a href="/watches/billing/">billing</a> <span class="tag">watch</span>' in row and "(deleted)" not in row
    assert '<optgroup label="Watches"><option value="billing">billing</option>' in page
    only_billing = client.get("/alerts/", {"pipeline": "billing"}).content.decode()
    assert f'id="alert-{alert.pk}"' in only_billing and f'id="alert-{other.pk}"' not in only_billing

    response = client.post(f"/api/alerts/{alert.pk}/mute/", {"minutes": 30, "reason": "migrating"},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    assert response.json()["mute"] | {"id": 0, "until": ""} == {"id": 0, "rule": alert.rule.name, "until": "",
                                                               "pipeline": "billing", "watch": "billing"}
    mute = Mute.objects.get()
    assert (mute.watch, mute.pipeline, mute.scope_label) == (alert.watch, None, "watch billing")
    assert alert.active_mute() == mute                        # the muted watch's alerts of that rule are held
    assert other.active_mute() is None and orders.active_mute() is None   # nothing else is
    page = client.get("/alerts/").content.decode()
    assert "any lost on watch billing until" in page
    assert "muted until" in page[page.index(f'id="alert-{alert.pk}"'):].split("</tr>")[0]
    assert "muted until" not in page[page.index(f'id="alert-{other.pk}"'):].split("</tr>")[0]


def test_the_filter_offers_a_deleted_pipelines_name_so_its_alerts_stay_filtered_when_the_state_changes(viewer):
    """The admin's and the emails' links filter by a deleted pipeline's name: the select shows it selected, so
    changing the state (the form is sent whole) keeps the filter."""
    gone, kept = open_alert("gone", state=AlertState.RESOLVED), open_alert("kept")
    Pipeline.objects.filter(name="gone").delete()
    page = client_for(viewer).get("/alerts/", {"state": "all", "pipeline": "gone"}).content.decode()
    assert f'id="alert-{gone.pk}"' in page and f'id="alert-{kept.pk}"' not in page
    assert '<option value="gone" selected>gone (deleted)</option>' in page
    assert '<option value="kept">kept</option>' in page


def test_a_mute_of_every_pipeline_and_watch_covers_both(operator):
    alert, orders = make_watch_alert("billing"), open_alert("orders")
    mute = Mute.mute(rule=None, minutes=10, user="olga")
    assert mute.scope_label == "all pipelines and watches"
    assert alert.active_mute() == mute and orders.active_mute() == mute
    assert mute.covers(alert) and mute.covers(orders)


def test_a_muted_watch_gets_no_reminder_while_another_watch_of_the_rule_does(db, settings):
    settings.ALERT_RECIPIENTS = ["team@example.com"]
    rule = AlertRule.objects.create(name="any loss", kind=RuleKind.LOST, reminder_seconds=60)
    muted_watch = Watch.objects.create(name="billing", group_id="team-billing", topic="billing")
    loud_watch = Watch.objects.create(name="shipping", group_id="team-shipping", topic="shipping")
    now = timezone.now()
    for watch in (muted_watch, loud_watch):
        evaluate.apply(rule, watch, Finding("2 lost records"), now, evaluate.EvaluationReport())
    evaluate.mute(Alert.objects.get(watch=muted_watch), 30, "olga", now=now)

    later = evaluate.EvaluationReport()
    for watch in (muted_watch, loud_watch):
        evaluate.apply(rule, watch, Finding("2 lost records"), now + timedelta(minutes=2), later)
    assert later.muted == ["billing/any loss"] and later.reminded == ["shipping/any loss"]
    sent = Notification.objects.values_list("alert__watch__name", "kind").order_by("alert__watch__name", "kind")
    assert list(sent) == [("billing", "fired"), ("shipping", "fired"), ("shipping", "reminder")]
    logged = ActionLog.objects.get(action="mute_alert")
    assert logged.message.startswith("muted rule 'any loss' on watch billing until")
