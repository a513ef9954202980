"""Real notification payloads (fired, reminder, resolved, of every rule kind that fires here, and the test
event) validate against the JSON schema documented in docs/alerts.md."""
import json
import re
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
import time_machine

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import AlertRule, Channel, Notification, RuleKind
from alerts.payloads import channel_test_payload
from consumers.models import DeadLetter, PartitionHealth, Status
from tests.test_alerts_email import T0, lost, make_pipeline, report_health

DOC = Path(__file__).resolve().parent.parent / "docs" / "alerts.md"


def documented_schema() -> dict:
    text = DOC.read_text()
    match = re.search(r"<!-- webhook-payload-schema -->\s*```json\n(.*?)\n```", text, re.S)
    assert match, "docs/alerts.md has no webhook payload schema block"
    return json.loads(match.group(1))


@pytest.fixture
def validator():
    schema = documented_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.django_db
def test_every_payload_evaluation_writes_matches_the_documented_schema(validator, settings):
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]
    with time_machine.travel(T0, tick=False):
        ensure_default_rules()
        AlertRule.objects.create(name="lag", kind=RuleKind.LAG_RECORDS, threshold=10, reminder_seconds=60)
        AlertRule.objects.filter(kind=RuleKind.DEAD_LETTERS).update(threshold=0)
        loss = make_pipeline("orders")
        report_health(loss, {0: ([lost(1, 4)], Status.OK)}, Status.ERR)
        lagging = make_pipeline("clicks", desired_state="running")
        report_health(lagging, {0: ([], Status.STALL)}, Status.STALL)
        PartitionHealth.objects.filter(pipeline=lagging).update(lag_records=500)
        DeadLetter.objects.create(pipeline=lagging, partition=0, offset=7, error="bad json",
                                  created_at=T0)
        evaluate_all(now=T0)
        evaluate_all(now=T0 + timedelta(seconds=60))
        report_health(loss, {0: ([], Status.OK)})
        evaluate_all(now=T0 + timedelta(seconds=90))

    payloads = [n.payload for n in Notification.objects.all()]
    events = {(p["event"], p["rule"]["kind"]) for p in payloads}
    assert {("fired", "lost"), ("resolved", "lost"), ("fired", "lag_records"), ("reminder", "lag_records"),
            ("fired", "status"), ("fired", "dead_letters")} <= events
    for payload in [*payloads, channel_test_payload(Channel(name="hooks", kind="webhook"))]:
        errors = sorted(validator.iter_errors(payload), key=str)
        assert not errors, f"{payload['event']} {payload['rule']['kind']}: {errors[0].message}"
    lag = next(p for p in payloads if p["rule"]["kind"] == "lag_records")
    assert lag["values"] == {"value": 500, "threshold": 10.0}


@pytest.mark.django_db   # the test event's key names the installation, whose key the database holds
def test_the_schema_refuses_a_payload_missing_its_firing_time(validator):
    payload = channel_test_payload(Channel(name="hooks", kind="webhook"))
    del payload["fired_at"]
    assert not validator.is_valid(payload)
    assert not validator.is_valid({**channel_test_payload(Channel(name="h", kind="webhook")), "event": "exploded"})
