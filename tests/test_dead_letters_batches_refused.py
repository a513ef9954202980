"""Replaying or discarding every matching dead letter, in audited batches of 1,000, when a batch after the first is
refused (Kafka went down during a replay from Kafka, or another refusal): the batches before it stay done, and every
door says so -- their counts and action ids -- beside what was refused and why, not "nothing was changed"."""
import html
import json
import time

import pytest

from consumers.engine.python import run_pipeline
from consumers.kafka import clusters
from consumers.kafka.broker import free_port
from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay
from consumers.operations import dead_letters as dead_letter_ops
from tests.commands import run_command
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.producing import into, send
from tests.test_dead_letters import fix_transform

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

LETTERS = 1200   # two batches: 1,000 and 200


@pytest.fixture
def orders(make_topic):
    """A pipeline that made LETTERS dead letters of records its fixed transform now takes ("x1", "x2", ...)."""
    topic = make_topic("orders", partitions=1)
    send(topic, into(0, (f"x{n}" for n in range(LETTERS))))
    pipeline = create_pipeline("orders", topic, "sink_batches_refused", "int_value")
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    assert DeadLetter.objects.count() == LETTERS
    fix_transform(pipeline)
    yield pipeline
    drop_sink_tables([pipeline.sink_table])


@pytest.fixture
def kafka_down_at_second_read(settings, monkeypatch):
    """Kafka goes down once the first batch's records were read: the second read finds nothing listening."""
    real = dead_letter_ops.kafka_admin.read_records
    reads = []

    def read_records(*args, **kwargs):
        reads.append(1)
        if len(reads) == 2:
            settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{free_port()}"
            settings.KAFKA_REQUEST_TIMEOUT_MS = 600
            monkeypatch.setitem(clusters._passed, repr(clusters.get()), time.monotonic())
            clusters.close_shared_admins()
        return real(*args, **kwargs)

    monkeypatch.setattr(dead_letter_ops.kafka_admin, "read_records", read_records)
    yield reads
    clusters.close_shared_admins()


@pytest.fixture
def transform_gone_at_second_batch(monkeypatch):
    """The pipeline's transform can no longer be loaded when the second batch comes: that replay is refused."""
    real = dead_letter_ops.replay
    calls = []

    def replay(pipeline, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            pipeline.transform = "tests.replay_transforms.gone"
        return real(pipeline, *args, **kwargs)

    monkeypatch.setattr(dead_letter_ops, "replay", replay)
    return calls


def first_batch_done() -> int:
    """The first batch's action id, once checked that it, and only it, was done and the second refused."""
    entries = list(ActionLog.objects.filter(action="replay_dead_letters").order_by("pk"))
    assert [e.result for e in entries] == [ActionResult.DONE, ActionResult.REFUSED]
    assert DeadLetterReplay.objects.count() == 1000 and DeadLetter.objects.count() == LETTERS - 1000
    return entries[0].pk


def says_what_was_done_and_why_the_rest_was_not(text: str, action_id: int, why: str) -> None:
    assert "nothing was changed" not in text.lower()
    assert (f"Replay stopped at batch 2 of 2. Done and kept: batch 1, 1000 dead letter(s): 1000 replayed (action log "
            f"#{action_id}). Not done: batch 2 (200 id(s), ") in text
    assert "200 dead letter(s) untouched, since it was refused: " + why in text


def test_the_api_says_what_the_batches_before_a_kafka_refusal_did(orders, operator_client, kafka_down_at_second_read):
    body = {"filter": {}, "count": LETTERS, "source": "kafka"}
    response = operator_client.post("/api/pipelines/orders/dead-letters/replay", json.dumps(body),
                                    content_type="application/json")
    action_id = first_batch_done()
    data = response.json()
    assert response.status_code == 409   # not the 503 whose answer means that nothing changed
    says_what_was_done_and_why_the_rest_was_not(data["error"], action_id, "Kafka: KafkaTimeoutError")
    assert (data["batches"], data["batches_done"], data["action_ids"], data["counts"], data["untouched"]) == (
        2, 1, [action_id], {"replayed": 1000}, 200)
    assert data["failed"].startswith("Kafka: KafkaTimeoutError") and "nothing was changed" not in data["failed"]


@pytest.mark.parametrize("as_json", [False, True])
def test_the_command_says_what_the_batches_before_a_kafka_refusal_did(capsys, orders, kafka_down_at_second_read,
                                                                      as_json):
    code, out, err = run_command(capsys, "dead_letters", "orders", "replay", "--all-matching", "--from-kafka",
                                 *(["--json"] if as_json else []))
    action_id = first_batch_done()
    assert code == 1
    assert err.startswith("CommandError: Refused: ")
    says_what_was_done_and_why_the_rest_was_not(err, action_id, "Kafka: KafkaTimeoutError")
    if as_json:
        data = json.loads(out)
        assert (data["action_ids"], data["counts"], data["untouched"]) == ([action_id], {"replayed": 1000}, 200)
    else:
        assert out.splitlines()[-1] == ("orders: replay: stopped after 1 of 2 batch(es); done (committed): 1000 "
                                        "dead letter(s): 1000 replayed")


def test_the_page_says_what_the_batches_before_a_refusal_did(orders, operator_client, transform_gone_at_second_batch):
    response = operator_client.post("/pipelines/orders/dead-letters/replay/",
                                    {"all_matching": "1", "expected": str(LETTERS), "confirmed": "1",
                                     "state": "pending"})
    action_id = first_batch_done()
    page = html.unescape(response.content.decode())
    assert response.status_code == 422
    error = page[page.index('id="dead-letter-error">'):].split("</p>")[0]
    says_what_was_done_and_why_the_rest_was_not(error, action_id, "The pipeline's transform cannot be loaded")
    assert f"as #{action_id}." in page
