"""PagerDuty incidents are this installation's: the dedup_key names the installation, so two Tally
installations sharing an integration key (or a database created again) never fold into or close each other's
incidents; and an incident opened before that still closes with the key it was opened with."""
import importlib
import json
from io import StringIO

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection

from alerts import payloads
from alerts.models import Alert, Channel, Installation, Notification
from alerts.outbox import deliver_due
from consumers.models import ActionLog, ActionResult
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.test_alert_channels import (
    add_channel,
    alert_settings,  # noqa: F401 - an autouse fixture
    at,
    fire_loss,
    resolve,
)
from tests.test_alerts_email import T0
from tests.views_helpers import client_of, make_viewer

migration = importlib.import_module("alerts.migrations.0006_installation_dedup_keys")


def pager(receiver):
    return add_channel("pager", "pagerduty", f"{receiver.url}/v2/enqueue", routing_key="RK")


def run_migration(function):
    with connection.schema_editor() as editor:
        function(apps, editor)


def test_the_dedup_key_names_this_installation_and_the_alert(receiver):
    pager(receiver)
    fire_loss()
    deliver_due(now=T0)
    [event] = receiver.bodies()
    assert Installation.objects.get().key.hex in event["dedup_key"]
    assert event["dedup_key"].endswith(f"-{Alert.objects.get().pk}")


def test_a_database_created_again_gives_the_same_alert_id_another_key(receiver):
    """A new database numbers its alerts from 1 again: under the old database's key, its alerts would fold into
    (or resolve) the incidents the old one opened."""
    pager(receiver)
    fire_loss()
    deliver_due(now=T0)
    [event] = receiver.bodies()
    Installation.objects.all().delete()
    run_migration(migration.create_installation)   # what a new database's migrations do
    assert payloads.dedup_key(Alert.objects.get()) != event["dedup_key"]


def test_an_incident_opened_before_installation_ids_resolves_with_the_key_it_was_opened_with(receiver):
    pager(receiver)
    pipeline = fire_loss()
    alert = Alert.objects.get()
    old_key = f"tally-alert-{alert.pk}"   # what Tally sent before installation ids
    for row in Notification.objects.filter(alert=alert):
        row.payload = {**row.payload, "dedup_key": old_key}
        row.save()
    deliver_due(now=T0)
    run_migration(migration.remember_old_dedup_keys)   # the upgrade, with the incident open
    resolve(pipeline, at(60))
    deliver_due(now=at(60))
    assert [(e["event_action"], e["dedup_key"]) for e in receiver.bodies()] == [("trigger", old_key),
                                                                               ("resolve", old_key)]


def test_a_new_alert_after_the_upgrade_gets_the_installations_key(receiver):
    pager(receiver)
    run_migration(migration.remember_old_dedup_keys)
    fire_loss()
    deliver_due(now=T0)
    [event] = receiver.bodies()
    assert Installation.objects.get().key.hex in event["dedup_key"]


# What PagerDuty's Events API answers (HTTP 400, "invalid event") when the routing key is wrong: an integration
# deleted or a key mistyped. The key is the channel's, not the message's: fixed, the messages must still go.
WRONG_KEY_ANSWERS = [
    '{"status":"invalid event","message":"Event object is invalid","errors":["Invalid routing key"]}',
    '{"status":"invalid event","message":"Event object is invalid",'
    '"errors":["Length of \'routing_key\' is incorrect (should be 32 characters)"]}',
]


@pytest.mark.parametrize("answer", WRONG_KEY_ANSWERS, ids=["unknown-key", "malformed-key"])
def test_a_wrong_routing_key_is_retried_so_the_incident_opens_and_closes_once_the_key_is_fixed(receiver, answer):
    from alerts import channel_actions

    channel = pager(receiver)
    receiver.answers = [(400, answer)]
    pipeline = fire_loss()
    assert deliver_due(now=T0) == {"sent": 0, "failed": 1, "gave_up": 0}
    fired = Notification.objects.get(channel=channel, kind="fired")
    assert fired.failed_at is None and "routing_key" in fired.last_error.lower().replace(" ", "_")

    channel.routing_key = "R" * 32   # the operator fixes the key on the Channels page
    channel_actions.save(channel, "ops")
    resolve(pipeline, at(3))
    assert deliver_due(now=at(5)) == {"sent": 2, "failed": 0, "gave_up": 0}
    assert [(e["event_action"], e["routing_key"]) for e in receiver.bodies()[1:]] == [("trigger", "R" * 32),
                                                                                      ("resolve", "R" * 32)]


def test_deleting_a_pagerduty_channel_resolves_the_incidents_it_opened_and_says_which(receiver):
    """Its outbox goes with it: without a resolve now, an incident it opened would stay open in PagerDuty for
    good (nobody is told the alert resolved), paging whoever is on call."""
    from io import StringIO

    from django.core.management import call_command

    from consumers.models import ActionLog

    pager(receiver)
    fire_loss("orders")
    deliver_due(now=T0)
    fire_loss("payments", at=at(1))    # queued, not sent yet: no incident of it to close
    [trigger] = receiver.bodies()

    out = StringIO()
    call_command("alert_channel", "delete", "pager", stdout=out)

    closing = receiver.bodies()[1:]
    assert [(e["event_action"], e["dedup_key"]) for e in closing] == [("resolve", trigger["dedup_key"])]
    assert f"resolved the incident {trigger['dedup_key']}" in out.getvalue()
    assert trigger["dedup_key"] in ActionLog.objects.get(action="alert_channel_delete").message
    assert Alert.objects.get(pipeline__name="orders").state == "firing"   # the alert itself is Tally's, untouched


def test_deleting_a_pagerduty_channel_that_cannot_resolve_its_incident_deletes_it_and_names_the_incident(receiver):
    pager(receiver)
    fire_loss("orders")
    deliver_due(now=T0)
    [trigger] = receiver.bodies()
    receiver.status, receiver.text = 500, "down"
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("alert_channel", "delete", "pager", stdout=out)

    assert f"the incident {trigger['dedup_key']} stays open (HTTP 500: down): resolve it in PagerDuty" \
        in out.getvalue()
    assert not Notification.objects.filter(channel__name="pager").exists()


def test_a_copied_database_given_a_key_of_its_own_never_resolves_the_originals_incident(receiver):
    """A database copied for staging holds the original's key, its open alerts and its channels. Even with its
    channels disabled it would still send the resolve of an alert the channel heard fire, under the original's
    dedup_key, and close the original's incident. `installation new-key` gives it a key of its own first."""
    pager(receiver)
    pipeline = fire_loss()
    deliver_due(now=T0)
    [fired] = receiver.bodies()
    before = Installation.current().key.hex
    out = StringIO()

    call_command("installation", "new-key", "--disable-channels", stdout=out)

    after = Installation.current().key.hex
    assert after != before
    assert out.getvalue().strip() == (
        f"Done: installation key {before} replaced by {after}; the next messages of 1 open alert(s) name the new "
        "key, so they no longer update or resolve the incidents opened under the old one; disabled alert "
        "channel(s): pager.")
    assert not Channel.objects.get(name="pager").enabled
    entry = ActionLog.objects.get(action="installation_new_key")
    assert (entry.actor, entry.result, entry.params) == (
        "cli", ActionResult.DONE, {"old_key": before, "new_key": after, "disabled_channels": ["pager"]})
    resolve(pipeline, at(60))
    deliver_due(now=at(60))
    [_, resolved] = receiver.bodies()
    assert resolved["event_action"] == "resolve"
    assert resolved["dedup_key"] == fired["dedup_key"].replace(before, after) != fired["dedup_key"]


def test_installation_show_names_the_key_and_the_channels_that_send():
    add_channel("mail", "email", recipients="ops@example.com")
    out = StringIO()
    call_command("installation", "show", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"key": Installation.current().key.hex, "enabled_channels": ["mail"]}


def test_a_new_key_takes_an_open_alerts_key_from_before_installation_ids_too(receiver):
    pager(receiver)
    fire_loss()
    Alert.objects.update(legacy_dedup_key=f"tally-alert-{Alert.objects.get().pk}")   # opened before them
    call_command("installation", "new-key", stdout=StringIO())
    assert payloads.dedup_key(Alert.objects.get()) == f"tally-{Installation.current().key.hex}-alert-" \
                                                      f"{Alert.objects.get().pk}"


def test_the_new_key_is_on_the_action_log_page_and_in_the_api():
    call_command("installation", "new-key", stdout=StringIO())
    new = Installation.current().key.hex
    viewer = client_of(make_viewer())
    page = viewer.get("/action-log/")
    assert page.status_code == 200 and "installation_new_key" in page.content.decode() and new in page.content.decode()
    listed = viewer.get("/api/action-log").json()
    assert [entry["action"] for entry in listed["actions"]][:1] == ["installation_new_key"], listed
