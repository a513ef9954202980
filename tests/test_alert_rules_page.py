"""The alert rules page: operators create, edit, mute and test rules (audited); bad input is refused beside
its field and nothing is saved; viewers read but cannot change anything."""
import pytest
from django.core import mail

from alerts.defaults import ensure_default_rules
from alerts.models import AlertRule, Mute
from consumers.models import ActionLog
from tests.views_helpers import make_pipeline, make_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def default_rules():
    ensure_default_rules()


def rule_form(**overrides):
    return {"name": "Orders lag", "kind": "lag_records", "pipeline": "", "threshold": "1000",
            "interval_seconds": "300", "statuses": "STALL,STOP,ERR", "recipients": "ops@example.com",
            "reminder_seconds": "3600", "enabled": "on", **overrides}


def test_an_operator_creates_and_edits_a_rule(operator_client):
    pipeline = make_pipeline()
    response = operator_client.post("/alerts/rules/new/", rule_form(pipeline=str(pipeline.pk)))
    assert response.status_code == 302 and response["Location"] == "/alerts/rules/"
    rule = AlertRule.objects.get(name="Orders lag")
    assert (rule.kind, rule.threshold, rule.pipeline, rule.recipient_list()) == (
        "lag_records", 1000.0, pipeline, ["ops@example.com"])
    operator_client.post(f"/alerts/rules/{rule.pk}/", rule_form(pipeline=str(pipeline.pk), threshold="5000"))
    assert AlertRule.objects.get(pk=rule.pk).threshold == 5000.0
    history = ActionLog.objects.filter(action="alert_rule").order_by("created_at")
    assert list(history.values_list("message", flat=True)) == [
        "alert rule 'Orders lag' created", "alert rule 'Orders lag' changed"]
    page = operator_client.get("/alerts/rules/").content.decode()
    assert f'id="rule-{rule.pk}"' in page and "ops@example.com" in page


@pytest.mark.parametrize("overrides, field, message", [
    ({"threshold": ""}, "threshold", "compares with a threshold"),
    ({"recipients": "ops@example.com, not-an-address"}, "recipients", "&#x27;not-an-address&#x27; is not an email"),
    ({"recipients": "a" * 65 + "@example.com"}, "recipients", "before @ is longer than 64 characters"),
    ({"kind": "status", "statuses": "ERR,BROKEN"}, "statuses", "Unknown status BROKEN"),
    ({"kind": "sometimes"}, "kind", "Select a valid choice"),
    ({"kind": "dead_letters", "threshold": "5", "interval_seconds": "0"}, "interval_seconds", "1 second or more"),
])
def test_bad_input_is_refused_beside_its_field_and_nothing_is_saved(operator_client, overrides, field, message):
    before = AlertRule.objects.count()
    response = operator_client.post("/alerts/rules/new/", rule_form(**overrides))
    html = response.content.decode()
    assert response.status_code == 400 and f'id="error-{field}"' in html and message in html
    assert AlertRule.objects.count() == before
    refusal = ActionLog.objects.get(result="refused")
    assert (refusal.action, refusal.params) == ("alert_rule", {"rule": "Orders lag"}) and field in refusal.message


@pytest.mark.parametrize("form, said", [({"minutes": "0"}, "Mute for 1 minute to 30 days."),
                                        ({"minutes": "forever"}, "Mute for 1 minute to 30 days."),
                                        ({"minutes": "10", "reason": "r" * 201}, "longer than 200 characters")])
def test_a_refused_rule_mute_mutes_nothing_and_is_audited(operator_client, form, said):
    rule = AlertRule.objects.get(kind="lost")
    response = operator_client.post(f"/alerts/rules/{rule.pk}/mute/", form, follow=True)
    assert said in response.content.decode()
    assert not Mute.objects.exists()
    refusal = ActionLog.objects.get(result="refused")
    assert refusal.action == "alert_mute" and said in refusal.message and refusal.params["rule"] == rule.name


def test_an_operator_mutes_a_rule_and_sends_a_test_email(operator_client, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    rule = AlertRule.objects.get(kind="lost")
    rule.recipients = "oncall@example.com"
    rule.save()
    operator_client.post(f"/alerts/rules/{rule.pk}/mute/", {"minutes": "480"})
    mute = Mute.objects.get(rule=rule)
    assert mute.pipeline is None and 479 <= (mute.until - mute.created_at).total_seconds() / 60 <= 480
    assert "muted until" in operator_client.get("/alerts/rules/").content.decode()
    response = operator_client.post(f"/alerts/rules/{rule.pk}/test/", follow=True)
    assert "Test email sent to oncall@example.com" in response.content.decode()
    assert [m.to for m in mail.outbox] == [["oncall@example.com"]] and "test of alert rule" in mail.outbox[0].subject
    assert ActionLog.objects.filter(action__in=["alert_mute", "alert_test"]).count() == 2


def test_a_mute_of_one_pipeline_leaves_the_rule_active_for_the_others_and_says_for_which(operator_client):
    rule = AlertRule.objects.get(kind="lost")
    orders = make_pipeline()
    mute = Mute.mute(rule=rule, pipeline=orders, minutes=60, user="olga")

    def cell():
        page = operator_client.get("/alerts/rules/").content.decode()
        return page.split(f'id="rule-{rule.pk}"')[1].split("</tr>")[0]

    shown = cell()
    assert '<span class="tag">active</span>' in shown and "muted until" not in shown
    assert f'data-mute="{mute.pk}">muted for orders until {mute.until:%Y-%m-%d %H:%M} UTC' in shown
    everything = Mute.mute(rule=rule, minutes=30, user="olga")
    shown = cell()
    assert f"muted until {everything.until:%Y-%m-%d %H:%M} UTC" in shown and "muted for orders" not in shown


def test_a_test_email_without_any_recipient_says_what_to_do(operator_client, settings):
    settings.ALERT_RECIPIENTS = []
    rule = AlertRule.objects.get(kind="lost")
    response = operator_client.post(f"/alerts/rules/{rule.pk}/test/", follow=True)
    assert "has no recipients and ALERT_RECIPIENTS is empty" in response.content.decode()


def test_a_viewer_reads_the_rules_but_cannot_change_mute_or_test_them(client):
    client.force_login(make_viewer())
    rule = AlertRule.objects.get(kind="lost")
    page = client.get("/alerts/rules/").content.decode()
    assert "only operators can change" in page and "Send a test email" not in page
    assert client.post("/alerts/rules/new/", rule_form()).status_code == 403
    assert client.post(f"/alerts/rules/{rule.pk}/mute/", {"minutes": "60"}).status_code == 403
    assert client.post(f"/alerts/rules/{rule.pk}/test/").status_code == 403
    assert not Mute.objects.exists() and not AlertRule.objects.filter(name="Orders lag").exists()
