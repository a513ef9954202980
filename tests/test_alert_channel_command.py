"""`manage.py alert_channel add|list|test|delete`: exit codes 0 / 1 / 2, the receiver's answer, and no secret
in anything it prints or logs."""
import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from alerts.management.commands.alert_channel import Command
from alerts.models import AlertRule, Channel, Installation
from consumers.models import ActionLog, ActionResult
from tests.receivers import Receiver

SLACK_TOKEN = "xoxb-SLACK-T0KEN-abcdef"
ROUTING_KEY = "PD-R0UTING-KEY-98765"
HMAC_SECRET = "hmac-SECRET-value-42"

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("alert_channel", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refused(*args) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 1
    return caught.value


@pytest.fixture
def receiver():
    receiver = Receiver(status=202, text='{"status":"success","message":"Event processed"}').start()
    yield receiver
    receiver.stop()


def add_all_kinds(url):
    run("add", "chat", "--kind", "slack", "--url", f"{url}/services/T1/B2/{SLACK_TOKEN}")
    run("add", "pager", "--kind", "pagerduty", "--url", f"{url}/v2/enqueue", "--routing-key", ROUTING_KEY)
    run("add", "hooks", "--kind", "webhook", "--url", f"{url}/hook?token={SLACK_TOKEN}", "--secret", HMAC_SECRET)
    run("add", "team", "--kind", "email", "--to", "team@example.com")


def assert_no_secret(text: str):
    for secret in (SLACK_TOKEN, ROUTING_KEY, HMAC_SECRET):
        assert secret not in text


def test_add_list_and_delete_with_secrets_masked_everywhere(receiver):
    add_all_kinds(receiver.url)

    listing = run("list")
    as_json = json.loads(run("list", "--json"))

    assert [c["name"] for c in as_json] == ["chat", "hooks", "pager", "team"]
    assert as_json[0]["url"] == f"http://127.0.0.1:{receiver.port}/••••••••"
    assert as_json[1]["signed"] is True and as_json[2]["routing_key"] == "••••••••"
    assert as_json[3]["to"] == ["team@example.com"] and all(c["rules"] == "all" for c in as_json)
    assert "pager  pagerduty" in listing and "routing key ••••••••" in listing
    log = ActionLog.objects.filter(action__startswith="alert_channel")
    assert log.count() == 4
    assert_no_secret(listing + json.dumps(as_json) + json.dumps(list(log.values("params", "message"))))

    assert run("delete", "chat").strip() == "Deleted alert channel chat."
    assert not Channel.objects.filter(name="chat").exists()
    assert ActionLog.objects.filter(action="alert_channel_delete").count() == 1


def test_test_reports_the_receivers_answer_and_pagerduty_resolves_its_test_incident(receiver):
    add_all_kinds(receiver.url)

    answer = run("test", "pager")

    assert "trigger: HTTP 202" in answer and "resolve: HTTP 202" in answer and "Event processed" in answer
    events = receiver.bodies()
    assert [e["event_action"] for e in events] == ["trigger", "resolve"]
    assert events[0]["dedup_key"] == events[1]["dedup_key"]
    assert_no_secret(answer)
    entry = ActionLog.objects.get(action="alert_channel_test")
    assert entry.result == ActionResult.DONE and "HTTP 202" in entry.message


def test_a_pagerduty_test_incident_names_this_installation_like_real_alerts(receiver):
    # Its key named the channel alone: two installations sharing an integration key and a channel name (say,
    # staging and production, both "pager") folded their tests into one incident, and either's resolve closed it.
    run("add", "pager", "--kind", "pagerduty", "--url", f"{receiver.url}/v2/enqueue", "--routing-key", ROUTING_KEY)

    run("test", "pager")

    installation = Installation.current().key.hex
    keys = {event["dedup_key"] for event in receiver.bodies()}
    assert len(keys) == 1 and keys.pop().startswith(f"tally-{installation}-test-pager-")


def test_a_pagerduty_test_whose_resolve_fails_says_its_test_incident_stays_open(receiver):
    # The answer was the resolve's error alone: it read as if nothing was sent, while an incident stayed open.
    receiver.answers = [(202, '{"status":"success"}'), (500, "resolve broke")]
    run("add", "pager", "--kind", "pagerduty", "--url", f"{receiver.url}/v2/enqueue", "--routing-key", ROUTING_KEY)

    error = str(refused("test", "pager"))

    dedup_key = receiver.bodies()[0]["dedup_key"]
    assert "trigger: HTTP 202" in error and "resolve failed: HTTP 500: resolve broke" in error
    assert f"the test incident {dedup_key} stays open: resolve it in PagerDuty" in error
    assert_no_secret(error)
    entry = ActionLog.objects.get(action="alert_channel_test")
    assert entry.result == ActionResult.FAILED and dedup_key in entry.message


def test_a_failed_test_exits_1_with_the_reason_and_no_secret():
    down = Receiver()
    run("add", "chat", "--kind", "slack", "--url", f"{down.url}/services/T1/B2/{SLACK_TOKEN}")

    error = refused("test", "chat")

    assert "Connection refused" in str(error)
    assert_no_secret(str(error))
    entry = ActionLog.objects.get(action="alert_channel_test")
    assert entry.result == ActionResult.FAILED
    assert_no_secret(entry.message)


def test_a_receiver_answering_500_fails_the_test_with_its_answer(receiver):
    receiver.status, receiver.text = 500, "no"
    run("add", "hooks", "--kind", "webhook", "--url", receiver.url)
    assert "HTTP 500: no" in str(refused("test", "hooks"))
    # Logged once, as the failed test it is: not a second time as a refusal.
    assert list(ActionLog.objects.filter(action="alert_channel_test").values_list("result", flat=True)) == ["failed"]


@pytest.mark.parametrize("args, field", [
    (["add", "x", "--kind", "slack"], "url"),
    (["add", "x", "--kind", "slack", "--url", "ftp://example.com/a"], "url"),
    (["add", "x", "--kind", "pagerduty"], "routing_key"),
    (["add", "x", "--kind", "email", "--to", "not-an-address"], "recipients"),
    # Django's validate_email passes it; a mail server refuses a local part over 64 characters (RFC 5321).
    (["add", "x", "--kind", "email", "--to", "a" * 65 + "@example.com"], "recipients"),
    (["add", "x", "--kind", "webhook", "--url", "https://example.com/", "--routing-key", "k"], "routing_key"),
    (["add", "bad name!", "--kind", "webhook", "--url", "https://example.com/"], "name"),
    (["add", "x", "--kind", "webhook", "--url", "https://example.com/", "--rule", "no such rule"], "rules"),
])
def test_invalid_settings_are_refused_with_exit_1_nothing_is_written_and_the_refusal_is_logged(args, field):
    error = refused(*args)
    assert f"{field}:" in str(error)
    assert not Channel.objects.exists()
    refusal = ActionLog.objects.get()   # as on the page, the admin and the API: the refusal, never a setting
    assert (refusal.action, refusal.actor, refusal.result) == ("alert_channel_add", "cli", "refused")
    assert refusal.params == {"via": "cli", "name": args[1], "kind": args[3]} and f"{field}:" in refusal.message


def test_a_duplicate_name_or_an_unknown_channel_is_refused():
    run("add", "hooks", "--kind", "webhook", "--url", "https://example.com/in")
    assert "exists already" in str(refused("add", "hooks", "--kind", "webhook", "--url", "https://example.com/in"))
    assert "no alert channel named 'nope'" in str(refused("test", "nope"))
    assert "no alert channel named 'gone'" in str(refused("delete", "gone"))
    assert list(ActionLog.objects.filter(result="refused").order_by("pk").values_list("action", "params")) == [
        ("alert_channel_add", {"via": "cli", "name": "hooks", "kind": "webhook"}),
        ("alert_channel_test", {"via": "cli", "name": "nope"}),
        ("alert_channel_delete", {"via": "cli", "name": "gone"})]
    assert "no alert channel named 'nope'" in str(refused("delete", "nope"))


def test_a_channel_routed_to_rules_lists_them():
    AlertRule.objects.create(name="orders lag", kind="lag_records", threshold=10)
    run("add", "hooks", "--kind", "webhook", "--url", "https://example.com/in", "--rule", "orders lag")
    assert "rules: orders lag" in run("list")
    assert json.loads(run("list", "--json"))[0]["rules"] == ["orders lag"]


@pytest.mark.parametrize("argv", [["add", "x", "--kind", "fax"], ["add", "x"], ["frobnicate"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        Command().run_from_argv(["manage.py", "alert_channel", *argv])
    assert caught.value.code == 2
