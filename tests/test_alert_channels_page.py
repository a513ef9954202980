"""The Channels page, its API and the Django admin: operators manage channels, viewers read the masked list,
every refusal is in the action log, and no saved secret is ever answered."""
import pytest
from django.contrib.auth.models import User
from django.test import Client

from alerts import channel_actions
from alerts.models import AlertRule, Channel
from consumers.models import ActionLog, ActionResult
from tests.receivers import Receiver
from tests.views_helpers import client_of, make_operator, make_viewer

SLACK_TOKEN = "xoxb-PAGE-T0KEN-123456"
ROUTING_KEY = "PAGE-R0UTING-KEY-777"
HMAC_SECRET = "page-HMAC-secret-999"

pytestmark = pytest.mark.django_db


@pytest.fixture
def channels(db):
    channel_actions.save(Channel(name="chat", kind="slack", url=f"https://hooks.slack.com/services/T1/B2/{SLACK_TOKEN}"),
                         "test")
    channel_actions.save(Channel(name="pager", kind="pagerduty", routing_key=ROUTING_KEY), "test")
    channel_actions.save(Channel(name="hooks", kind="webhook", url="https://example.com/in", secret=HMAC_SECRET),
                         "test")


def assert_no_secret(text: str):
    for secret in (SLACK_TOKEN, ROUTING_KEY, HMAC_SECRET):
        assert secret not in text


def test_a_viewer_reads_the_masked_list_without_buttons(channels):
    page = client_of(make_viewer()).get("/alerts/channels/").content.decode()
    assert 'id="channel-chat"' in page and "https://hooks.slack.com/••••••••" in page
    assert "routing key <code>••••••••</code>" in page and "signed" in page
    assert "Send a test" not in page and "New channel" not in page
    assert_no_secret(page)


def test_a_viewers_attempts_are_refused_and_audited(channels):
    client = client_of(make_viewer())
    attempts = [("/alerts/channels/new/", {"name": "x", "kind": "webhook", "url": "https://example.com/"}),
                ("/alerts/channels/chat/", {"name": "chat", "kind": "slack", "url": "https://example.com/"}),
                ("/alerts/channels/chat/test/", {}), ("/alerts/channels/chat/delete/", {})]
    for path, data in attempts:
        assert client.post(path, data).status_code == 403
    refusals = ActionLog.objects.filter(result=ActionResult.REFUSED).order_by("pk")
    assert [r.action for r in refusals] == ["alert_channel_add", "alert_channel_change", "alert_channel_test",
                                            "alert_channel_delete"]
    assert all(r.actor == "vera" for r in refusals)
    assert Channel.objects.count() == 3 and not Channel.objects.filter(name="x").exists()
    assert Channel.objects.get(name="chat").url.endswith(SLACK_TOKEN)


def test_an_operator_adds_a_slack_channel_routed_to_one_rule_and_never_sees_its_token_again():
    rule = AlertRule.objects.create(name="orders lag", kind="lag_records", threshold=10)
    client = client_of(make_operator())
    response = client.post("/alerts/channels/new/", {"name": "chat", "kind": "slack", "url":
                                                     f"https://hooks.slack.com/services/T1/B2/{SLACK_TOKEN}",
                                                     "rules": [rule.pk], "enabled": "on"})
    assert response.status_code == 302 and response["Location"] == "/alerts/channels/"
    channel = Channel.objects.get(name="chat")
    assert list(channel.rules.all()) == [rule] and channel.url.endswith(SLACK_TOKEN)

    listing = client.get("/alerts/channels/").content.decode()
    edit = client.get("/alerts/channels/chat/").content.decode()
    assert "orders lag" in listing and "Saved: https://hooks.slack.com/••••••••" in edit
    assert_no_secret(listing + edit)

    # Saving the edit form with the secret left empty keeps it.
    assert client.post("/alerts/channels/chat/", {"kind": "slack", "url": "", "rules": []}).status_code == 302
    channel.refresh_from_db()
    assert channel.url.endswith(SLACK_TOKEN) and not channel.enabled and not channel.rules.exists()
    assert_no_secret(str(list(ActionLog.objects.values("params", "message"))))


def test_bad_input_is_a_400_naming_the_field_audited_and_nothing_is_saved():
    client = client_of(make_operator())
    response = client.post("/alerts/channels/new/", {"name": "pager", "kind": "pagerduty", "url": "nope"})
    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="error-routing_key"' in page and 'id="error-url"' in page
    assert not Channel.objects.exists()
    refusal = ActionLog.objects.get(result=ActionResult.REFUSED)
    assert refusal.action == "alert_channel_add" and "routing_key" in refusal.message


def test_an_operator_tests_a_channel_and_sees_the_receivers_answer():
    receiver = Receiver(status=200, text="ok").start()
    try:
        channel_actions.save(Channel(name="hooks", kind="webhook", url=f"{receiver.url}/x/{SLACK_TOKEN}"), "test")
        client = client_of(make_operator())
        client.post("/alerts/channels/hooks/test/")
        page = client.get("/alerts/channels/").content.decode()
    finally:
        receiver.stop()
    assert "Test of hooks: HTTP 200: ok" in page
    assert receiver.bodies()[0]["event"] == "test"


def test_a_failing_channel_shows_failing_on_its_page(channels):
    from django.utils import timezone

    Channel.objects.filter(name="hooks").update(failing_since=timezone.now(), consecutive_failures=7,
                                                last_error="connection failed: [Errno 111] Connection refused")
    page = client_of(make_viewer()).get("/alerts/channels/").content.decode()
    row = page.split('id="channel-hooks"')[1].split("</tr>")[0]
    assert 'data-state="failing"' in page and ">failing</span>" in row and "Connection refused" in row


def test_the_api_lists_masked_channels_and_refuses_viewers(channels):
    viewer = client_of(make_viewer())
    listed = viewer.get("/api/alerts/channels/")
    assert listed.status_code == 200
    assert {c["name"]: c.get("routing_key") for c in listed.json()["channels"]}["pager"] == "••••••••"
    assert_no_secret(listed.content.decode() + viewer.get("/api/alerts/channels/chat/").content.decode())

    assert viewer.post("/api/alerts/channels/", {"name": "x", "kind": "webhook", "url": "https://e.com/"},
                       content_type="application/json").status_code == 403
    assert viewer.delete("/api/alerts/channels/chat/").status_code == 403
    assert viewer.post("/api/alerts/channels/chat/test/").status_code == 403
    assert ActionLog.objects.filter(result=ActionResult.REFUSED, actor="vera").count() == 3
    assert Channel.objects.count() == 3
    assert Client().get("/api/alerts/channels/").status_code in (401, 403)


def test_the_api_adds_with_strict_types_and_deletes():
    operator = client_of(make_operator())
    bad = operator.post("/api/alerts/channels/", {"name": "pager", "kind": "pagerduty", "routing_key": ROUTING_KEY,
                                                  "enabled": "yes"}, content_type="application/json")
    assert bad.status_code == 400 and "enabled" in bad.json()["errors"]
    invalid = operator.post("/api/alerts/channels/", {"name": "pager", "kind": "pagerduty"},
                            content_type="application/json")
    assert invalid.status_code == 400 and "routing_key" in invalid.json()["errors"]
    assert not Channel.objects.exists()

    created = operator.post("/api/alerts/channels/", {"name": "pager", "kind": "pagerduty",
                                                      "routing_key": ROUTING_KEY}, content_type="application/json")
    assert created.status_code == 201 and created.json()["channel"]["routing_key"] == "••••••••"
    assert_no_secret(created.content.decode())
    twice = operator.post("/api/alerts/channels/", {"name": "pager", "kind": "pagerduty", "routing_key": "k"},
                          content_type="application/json")
    assert twice.status_code == 409
    assert operator.delete("/api/alerts/channels/pager/").status_code == 204
    assert not Channel.objects.exists()


def test_the_admin_validates_and_never_renders_a_secret(channels):
    admin = User.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client = client_of(admin)
    chat = Channel.objects.get(name="chat")
    pages = [client.get("/admin/alerts/channel/").content.decode(),
             client.get(f"/admin/alerts/channel/{chat.pk}/change/").content.decode()]
    assert "https://hooks.slack.com/••••••••" in pages[0]
    assert_no_secret("".join(pages))

    refused = client.post("/admin/alerts/channel/add/", {"name": "mail", "kind": "email", "recipients": "nope",
                                                         "enabled": "on"})
    assert refused.status_code == 200 and "is not an email address" in refused.content.decode()
    assert not Channel.objects.filter(name="mail").exists()
    refusal = ActionLog.objects.get(action="alert_channel_add", result="refused")
    assert refusal.actor == "root" and refusal.params == {"channel": "mail", "via": "admin"}
    assert "recipients:" in refusal.message and "is not an email address" in refusal.message
    added = client.post("/admin/alerts/channel/add/", {"name": "mail", "kind": "email",
                                                       "recipients": "team@example.com", "enabled": "on"})
    assert added.status_code == 302 and Channel.objects.get(name="mail").recipient_list() == ["team@example.com"]
    assert ActionLog.objects.filter(action="alert_channel_add", params__name="mail").exists()


def test_the_rules_page_names_the_channels_each_rule_reaches(channels):
    lag = AlertRule.objects.create(name="orders lag", kind="lag_records", threshold=10)
    other = AlertRule.objects.create(name="orders loss", kind="lost")
    channel_actions.save(Channel(name="lag-pager", kind="pagerduty", routing_key="k"), "test", [lag])
    page = client_of(make_viewer()).get("/alerts/rules/").content.decode()
    lag_row = page.split(f'id="rule-{lag.pk}"')[1].split("</tr>")[0]
    other_row = page.split(f'id="rule-{other.pk}"')[1].split("</tr>")[0]
    assert "<td>chat, hooks, lag-pager, pager</td>" in lag_row
    assert "<td>chat, hooks, pager</td>" in other_row


def test_a_channel_changing_kind_keeps_no_secret_of_its_old_kind(channels):
    client = client_of(make_operator())
    response = client.post("/alerts/channels/hooks/", {"kind": "pagerduty", "routing_key": "NEW-KEY", "enabled": "on"})
    assert response.status_code == 302, ActionLog.objects.filter(result=ActionResult.REFUSED).first().message
    channel = Channel.objects.get(name="hooks")
    assert (channel.kind, channel.url, channel.secret, channel.routing_key) == ("pagerduty", "", "", "NEW-KEY")


@pytest.mark.parametrize("name, secret_field, secret", [("pager", "routing_key", ROUTING_KEY),
                                                        ("hooks", "secret", HMAC_SECRET)])
def test_a_new_url_keeps_no_saved_secret_until_it_is_entered_again(channels, name, secret_field, secret):
    """Whoever edits a channel may not send its saved routing key (or sign with its saved secret) to a host of
    their own: a changed URL asks for the secret again, and nothing changes until it is given."""
    client = client_of(make_operator())
    kind = Channel.objects.get(name=name).kind
    refused = client.post(f"/alerts/channels/{name}/", {"kind": kind, "url": "https://attacker.example/in",
                                                         "enabled": "on"})
    assert refused.status_code == 400 and "The URL changed: enter this again." in refused.content.decode()
    channel = Channel.objects.get(name=name)
    assert channel.url != "https://attacker.example/in" and getattr(channel, secret_field) == secret

    kept = client.post(f"/alerts/channels/{name}/", {"kind": kind, "url": "", "enabled": "on"})
    assert kept.status_code == 302 and getattr(Channel.objects.get(name=name), secret_field) == secret
    moved = client.post(f"/alerts/channels/{name}/", {"kind": kind, "url": "https://elsewhere.example/in",
                                                       secret_field: "NEW-SECRET-1", "enabled": "on"})
    assert moved.status_code == 302
    channel = Channel.objects.get(name=name)
    assert (channel.url, getattr(channel, secret_field)) == ("https://elsewhere.example/in", "NEW-SECRET-1")
