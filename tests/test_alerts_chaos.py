"""End to end with real data: the classic demo's at-most-once consumer loses records under crashes; the
reconciliation task in a real Celery worker finds them, alert evaluation follows it, and the loss email that
reaches a real SMTP server names exactly the lost offsets. A real operator rewind then sends nothing."""
import re

import pytest

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert
from alerts.outbox import deliver_due
from consumers.demo.classic import DEMO_PIPELINES, DEMO_TOPIC, run_classic_demo
from consumers.engine import db, sinks
from consumers.models import Pipeline
from consumers.operations import rewind
from consumers.reconciliation import reconcile
from tests.producing import into, send
from tests.test_alerts_worker import alerts_worker, smtp_inbox  # noqa: F401 - fixtures
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.chaos, pytest.mark.celery]

RECORDS = 100
# Each batch of 10 crashes with this probability: P(no crash in 10 batches) = 0.5**10, about 0.1 %.
CRASH_PROBABILITY = 0.5


@pytest.fixture
def demo_sinks(transactional_db):
    yield
    conn = db.connect("tally-tests")
    with conn.cursor() as cursor:
        for demo in DEMO_PIPELINES:
            sinks.drop_sink_table(cursor, demo.sink_table)
    conn.commit()
    conn.close()


def offsets_named(text: str, pipeline: str) -> set[int]:
    """Every offset an email names for partition 0: "offsets 3-12, 40, 55-64" -> {3..12, 40, 55..64}."""
    line = re.search(r"partition 0: \d+ records, offsets ([0-9, -]+)", text)
    assert line, f"no partition line in the email for {pipeline}:\n{text}"
    named = set()
    for part in line.group(1).split(","):
        start, _, end = part.strip().partition("-")
        named.update(range(int(start), int(end or start) + 1))
    return named


def wait_for_mail(inbox, predicate, timeout=90):
    return wait_for(lambda: [m for m in inbox.messages if predicate(m)], timeout,
                    f"a matching email; got {[m['subject'] for m in inbox.messages]}")


def test_at_most_once_chaos_emails_a_loss_alert_naming_the_lost_offsets_and_a_rewind_sends_none(
        kafka_bootstrap, demo_sinks, alerts_worker, smtp_inbox, settings):  # noqa: F811
    from consumers.tasks.reconciliation import reconcile_all_task

    ensure_default_rules()
    # The demo's pipeline processes use this process's database: the test's, as the worker does.
    status = run_classic_demo(records=RECORDS, crash_probability=CRASH_PROBABILITY, timeout_s=300)
    at_most_once = status["nums-at-most-once"]
    assert at_most_once["state"] == "done" and at_most_once["missing"], status
    lost_offsets = {value - 1 for value in at_most_once["missing"]}  # one partition: value v sits at offset v-1

    # Beat's reconciliation task, in the worker; alert evaluation follows it there and sends the email.
    reconcile_all_task.apply_async().get(timeout=120)

    [loss] = wait_for_mail(smtp_inbox, lambda m: "nums-at-most-once" in m["subject"] and "lost" in m["subject"])
    assert loss["subject"].startswith(f"[Tally] FIRING: nums-at-most-once: {len(lost_offsets)} lost records")
    assert offsets_named(loss["text"], "nums-at-most-once") == lost_offsets
    assert loss["to"] == ["oncall@example.com"]
    if status["nums-at-least-once"]["duplicated"]:
        wait_for_mail(smtp_inbox, lambda m: "nums-at-least-once" in m["subject"] and "duplicated" in m["subject"])
    assert not [m for m in smtp_inbox.messages if "nums-exactly-once" in m["subject"]]

    # An operator skips 20 new records of the exactly-once pipeline on purpose: planned, no alert.
    send(DEMO_TOPIC, into(0, range(RECORDS + 1, RECORDS + 21)))
    rewind.rewind("nums-exactly-once", "to-latest", actor="alice")
    reconcile.reconcile_pipeline(Pipeline.objects.get(name="nums-exactly-once"))
    mails_before = len(smtp_inbox.messages)
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp_inbox.port
    evaluate_all()
    deliver_due()

    assert not Alert.objects.filter(pipeline__name="nums-exactly-once").exists()
    assert len(smtp_inbox.messages) == mails_before
