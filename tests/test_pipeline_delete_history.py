"""`pipeline delete NAME` keeps the history: the action log and the alerts (with their emails) survive the
pipeline and its own alert rules, still naming them; an alert still open is resolved by the deletion."""
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from alerts import evaluate
from alerts.models import Alert, AlertRule, AlertState, Mute, Notification, NotificationKind, RuleKind
from consumers.models import ActionLog, ActionResult, Pipeline
from tests.commands import run_command

pytestmark = pytest.mark.django_db(transaction=True)  # the command closes its connections when it ends


def run_pipeline_command(capsys, *argv):
    return run_command(capsys, "pipeline", *argv)


@pytest.fixture
def history(settings):
    """orders, stopped, with a resolved alert of a global rule (its two emails sent), a firing alert of its own
    rule (its email queued), an action log entry, and a mute of its own that has ended."""
    settings.ALERT_RECIPIENTS = ["ops@example.com"]
    now = timezone.now()
    orders = Pipeline.objects.create(name="orders", topic="orders-topic", sink_table="sink_orders")
    everywhere = AlertRule.objects.create(name="Any loss", kind=RuleKind.LOST)
    own = AlertRule.objects.create(name="Orders lag", kind=RuleKind.LAG_RECORDS, threshold=100, pipeline=orders)
    old = Alert.objects.create(rule=everywhere, pipeline=orders, state=AlertState.RESOLVED, summary="3 records lost",
                               started_at=now, last_seen_at=now, notified_at=now, resolved_at=now)
    for kind in (NotificationKind.FIRED, NotificationKind.RESOLVED):
        Notification.objects.create(alert=old, kind=kind, recipients=["ops@example.com"], subject=f"{kind} orders",
                                    body_text="...", body_html="...", created_at=now, next_attempt_at=now,
                                    delivered_at=now)
    firing = Alert.objects.create(rule=own, pipeline=orders, state=AlertState.FIRING, summary="lag 500 records",
                                  started_at=now, last_seen_at=now, notified_at=now)
    Notification.objects.create(alert=firing, kind=NotificationKind.FIRED, recipients=["ops@example.com"],
                                subject="fired orders", body_text="...", body_html="...", created_at=now,
                                next_attempt_at=now)
    Mute.objects.create(rule=None, pipeline=orders, until=now - timedelta(minutes=1), created_by="otto")  # ended
    ActionLog.objects.create(pipeline=orders, action="start", actor="otto", result=ActionResult.DONE)
    return {"pipeline": orders, "old": old, "firing": firing, "global_rule": everywhere}


def test_deleting_a_pipeline_keeps_its_alerts_their_emails_and_the_action_log(capsys, history):
    code, out, err = run_pipeline_command(capsys, "delete", "orders")
    assert code == 0, err

    assert not Pipeline.objects.exists()
    old, firing = Alert.objects.get(pk=history["old"].pk), Alert.objects.get(pk=history["firing"].pk)
    assert (old.pipeline_id, old.pipeline_label, old.rule_id, old.rule_label) == (None, "orders",
                                                                                  history["global_rule"].pk, "Any loss")
    # Its own rule went with the pipeline; the alert still says which rule it was.
    assert not AlertRule.objects.filter(name="Orders lag").exists() and not Mute.objects.exists()
    assert (firing.pipeline_id, firing.pipeline_label, firing.rule_id, firing.rule_label, firing.rule_kind) == (
        None, "orders", None, "Orders lag", RuleKind.LAG_RECORDS)
    assert firing.state == AlertState.RESOLVED and firing.resolved_at is not None
    assert firing.facts["resolved_because"] == "pipeline orders deleted"
    emails = sorted(Notification.objects.values_list("alert_id", "kind"))
    assert emails == sorted([(old.pk, "fired"), (old.pk, "resolved"), (firing.pk, "fired"), (firing.pk, "resolved")])
    resolved_email = Notification.objects.get(alert=firing, kind=NotificationKind.RESOLVED)
    assert resolved_email.subject.startswith("[Tally] RESOLVED: orders: lag 500 records")
    assert list(ActionLog.objects.order_by("pk").values_list("action", "params__pipeline")) == [("start", "orders"),
                                                                                                ("delete", "orders")]


def test_the_alert_history_of_a_deleted_pipeline_is_listed_on_the_page_and_the_api(capsys, history, viewer_client):
    run_pipeline_command(capsys, "delete", "orders")
    page = viewer_client.get("/alerts/?state=all&pipeline=orders")
    html = page.content.decode()
    assert page.status_code == 200
    assert html.count("orders <span class=\"muted\">(deleted)</span>") == 2
    assert "Orders lag" in html and "Any loss" in html
    api = viewer_client.get("/api/alerts/?state=all&pipeline=orders").json()["alerts"]
    assert sorted((a["pipeline"], a["rule"], a["kind"]) for a in api) == [("orders", "Any loss", "lost"),
                                                                           ("orders", "Orders lag", "lag_records")]
    detail = viewer_client.get(f"/api/alerts/{history['firing'].pk}/").json()
    assert [n["kind"] for n in detail["notifications"]] == ["resolved", "fired"]   # newest first


def test_an_alert_of_a_deleted_pipeline_cannot_be_muted(capsys, history, operator_client):
    run_pipeline_command(capsys, "delete", "orders")
    response = operator_client.post(f"/api/alerts/{history['old'].pk}/mute/", data={"minutes": 60},
                                    content_type="application/json")
    assert response.status_code == 409
    assert "deleted" in response.json()["error"]
    assert not Mute.objects.exists()   # never a mute of every rule on every pipeline
    refusal = ActionLog.objects.get(action="mute_alert")
    assert (refusal.actor, refusal.result) == ("otto", "refused") and "deleted" in refusal.message
    with pytest.raises(evaluate.AlertGone):
        evaluate.mute(Alert.objects.get(pk=history["old"].pk), 60, "otto")


def test_evaluation_goes_on_after_a_pipeline_and_its_rules_are_deleted(capsys, history):
    run_pipeline_command(capsys, "delete", "orders")
    report = evaluate.evaluate_all()
    assert report.errors == [] and report.resolved == [] and report.pipelines == 0
    assert Alert.objects.filter(state__in=(AlertState.FIRING, AlertState.ACKNOWLEDGED)).count() == 0


def test_the_action_log_finds_a_deleted_pipelines_entries_by_its_name_and_refuses_a_name_never_used(
        capsys, history, viewer_client):
    ActionLog.objects.create(pipeline=None, group_id="billing", action="reset_group", actor="otto",
                             result=ActionResult.DONE, params={"cluster": "default"})
    code, _, err = run_pipeline_command(capsys, "delete", "orders")
    assert code == 0, err
    ids = set(ActionLog.objects.filter(params__pipeline="orders").values_list("pk", flat=True))  # start, delete
    assert len(ids) == 2

    for fragment in ({}, {"HTTP_HX_REQUEST": "true"}):
        page = viewer_client.get("/action-log/", {"pipeline": "orders"}, **fragment)
        shown = {int(pk) for pk in re.findall(r'<tr id="action-(\d+)"', page.content.decode())}
        assert page.status_code == 200 and shown == ids
    assert '<option value="orders" selected>orders (deleted)</option>' in viewer_client.get(
        "/action-log/", {"pipeline": "orders"}).content.decode()
    api = viewer_client.get("/api/action-log", {"pipeline": "orders"}).json()["actions"]
    assert {e["id"] for e in api} == ids and {e["pipeline"] for e in api} == {"orders"}

    for fragment in ({}, {"HTTP_HX_REQUEST": "true"}):
        page = viewer_client.get("/action-log/", {"pipeline": "nosuch"}, **fragment)
        body = page.content.decode()
        assert page.status_code == 400 and '<tr id="action-' not in body
        assert "No pipeline named &#x27;nosuch&#x27;, now or deleted" in body
    api = viewer_client.get("/api/action-log", {"pipeline": "nosuch"})
    assert api.status_code == 400 and "No pipeline named 'nosuch', now or deleted" in (
        api.json()["errors"]["pipeline"][0]["message"])
    assert viewer_client.get("/action-log/", {"pipeline": ""}).status_code == 200  # no filter: every entry
