"""The alerts' admin: a rule is edited with the rules page's form (the same checks) and every change there
is in the action log; alerts and mutes change through the audited actions only (read-only rows), and lifting
a mute is audited."""
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone

from alerts.channels import MASK
from alerts.models import AlertRule, AlertState, Channel, Mute, Notification, NotificationKind, RuleKind
from consumers.models import ActionLog, ActionResult
from tests.alert_rows import open_alert
from tests.views_helpers import client_of, make_pipeline, make_superuser

pytestmark = pytest.mark.django_db
RULES = "/admin/alerts/alertrule/"


@pytest.fixture
def root():
    return client_of(make_superuser())


def rule_form(**overrides):
    return {"name": "admin-made loss", "kind": RuleKind.LOST, "pipeline": "", "threshold": "1",
            "interval_seconds": "60", "statuses": "", "recipients": "ops@example.com", "reminder_seconds": "3600",
            "enabled": "on",
            **overrides}


@pytest.mark.parametrize("overrides", [{"recipients": "not an address"}, {"statuses": "PURPLE"}])
def test_the_admin_refuses_a_rule_the_rules_page_refuses(root, overrides):
    response = root.post(f"{RULES}add/", rule_form(**overrides))
    assert response.status_code == 200 and response.context["adminform"].form.errors
    assert not AlertRule.objects.filter(name="admin-made loss").exists()
    refusal = ActionLog.objects.get()   # audited, as the rules page audits it
    assert (refusal.action, refusal.actor, refusal.result) == ("alert_rule", "root", ActionResult.REFUSED)
    assert refusal.message.startswith("bad input: ") and refusal.params == {"rule": "admin-made loss", "via": "admin"}


def test_adding_changing_and_deleting_a_rule_in_the_admin_is_audited(root):
    assert root.post(f"{RULES}add/", rule_form()).status_code == 302
    rule = AlertRule.objects.get(name="admin-made loss")
    assert root.post(f"{RULES}{rule.pk}/change/", rule_form(threshold="5")).status_code == 302
    assert root.post(f"{RULES}{rule.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not AlertRule.objects.filter(name="admin-made loss").exists()
    entries = list(ActionLog.objects.order_by("pk").values_list("action", "actor", "result", "message"))
    assert [(a, actor, r) for a, actor, r, _ in entries] == [("alert_rule", "root", ActionResult.DONE)] * 3
    assert ["created" in entries[0][3], "changed" in entries[1][3], "deleted" in entries[2][3]] == [True] * 3
    assert ActionLog.objects.order_by("pk")[1].params["changed"] == ["threshold"]



def test_alerts_are_read_only_in_the_admin(root):
    alert = open_alert(make_pipeline(with_history=False), summary="3 lost")
    root.post(f"/admin/alerts/alert/{alert.pk}/change/", {"state": AlertState.RESOLVED, "summary": "fine"})
    assert root.post(f"/admin/alerts/alert/{alert.pk}/delete/", {"post": "yes"}).status_code == 403
    alert.refresh_from_db()
    assert (alert.state, alert.summary) == (AlertState.FIRING, "3 lost")
    assert root.get("/admin/alerts/alert/add/").status_code == 403
    assert root.get("/admin/alerts/mute/add/").status_code == 403


def test_lifting_a_mute_in_the_admin_is_audited(root):
    pipeline = make_pipeline(with_history=False)
    mute = Mute.objects.create(pipeline=pipeline, until=timezone.now() + timezone.timedelta(hours=1), reason="deploy")
    assert root.post(f"/admin/alerts/mute/{mute.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not Mute.objects.exists()
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.pipeline) == ("alert_unmute", "root", pipeline)


def test_the_outbox_is_read_only_in_the_admin_so_no_notification_is_changed_or_deleted_unaudited(root):
    alert, now = open_alert(make_pipeline(with_history=False)), timezone.now()
    pending = Notification.objects.create(alert=alert, kind=NotificationKind.FIRED, recipients=["ops@example.com"],
                                          subject="3 lost", body_text="3 lost", body_html="<p>3 lost</p>",
                                          created_at=now, next_attempt_at=now)
    outbox = "/admin/alerts/notification/"
    assert root.get(outbox).status_code == 200 and b'value="delete_selected"' not in root.get(outbox).content
    assert root.get(f"{outbox}{pending.pk}/change/").status_code == 200   # readable

    assert root.post(f"{outbox}{pending.pk}/change/", {"attempts": "0"}).status_code == 403
    assert root.post(f"{outbox}{pending.pk}/delete/", {"post": "yes"}).status_code == 403
    # An action it does not offer is refused, and audited as the other refusals are.
    assert root.post(outbox, {"action": "delete_selected", "_selected_action": [pending.pk], "index": "0",
                              "post": "yes"}).status_code == 403

    assert Notification.objects.filter(pk=pending.pk, delivered_at=None, failed_at=None).exists()
    assert not LogEntry.objects.exists()


PAGER_KEY, HOOK_SECRET, HOOK_TOKEN, SLACK_TOKEN = ("R0UTING-KEY-pd-1234", "sign-me-s3cret", "HOOK-T0KEN-987",
                                                   "SLACK-T0KEN-xyz")


def test_a_staff_user_who_may_only_view_channels_sees_them_masked_in_the_admin():
    """The change page answered 500 (the form has no fields for a view-only user), and Django's read-only display
    would have shown the URL's token, the routing key and the signing secret as stored."""
    channels = [
        Channel.objects.create(name="pager", kind="pagerduty", routing_key=PAGER_KEY),
        Channel.objects.create(name="hooks", kind="webhook", url=f"https://hooks.example.com/in/{HOOK_TOKEN}",
                               secret=HOOK_SECRET),
        Channel.objects.create(name="chat", kind="slack", url=f"https://hooks.slack.com/services/T1/B2/{SLACK_TOKEN}"),
    ]
    viewer = get_user_model().objects.create_user("vic", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="alerts", codename="view_channel"))
    client = client_of(viewer)

    pages = [client.get("/admin/alerts/channel/")] + [
        client.get(f"/admin/alerts/channel/{channel.pk}/change/") for channel in channels]

    assert [page.status_code for page in pages] == [200] * 4
    for channel, page in zip(channels, pages[1:], strict=True):
        assert channel.name in page.content.decode() and MASK in page.content.decode()
    for page in pages:
        for secret in (PAGER_KEY, HOOK_SECRET, HOOK_TOKEN, SLACK_TOKEN):
            assert secret not in page.content.decode()
