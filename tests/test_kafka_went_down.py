"""Kafka went down after its cluster's check passed (the check is trusted for PREFLIGHT_TTL_S): every door that
calls Kafka on request answers the operation's Unavailable refusal -- a 503 from the API and on htmx panels, exit
code 1 with the reason from a command, a refusal message in the admin -- never a 500 or a traceback."""
import html
import json

import pytest
from django.db import connection

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult, Watch, WatchPartition
from tests.admin_support import messages_of, post_action, staff_operator
from tests.api_schema import assert_documented, operation
from tests.commands import run_command
from tests.kafka_down import kafka_refusal
from tests.test_dead_letters_page import letters, snapshot  # noqa: F401 (fixture)
from tests.views_helpers import client_of, make_operator, make_pipeline, make_viewer

PIPELINES = "/admin/consumers/pipeline/"


def get_documented(client, template: str, path: str):
    """GET `path` from the API; fails unless the schema documents the answer (status and body)."""
    response = client.get(path)
    assert_documented(operation("get", template), response, "get", path)
    return response


def rewind_refusals() -> list[ActionLog]:
    entries = list(ActionLog.objects.filter(action="rewind").order_by("pk"))
    assert all(e.result == ActionResult.REFUSED and kafka_refusal(e.message) for e in entries), \
        [(e.result, e.message) for e in entries]
    return entries


def test_a_rewind_from_its_page_answers_503_in_the_panel_audited_and_the_pipeline_keeps_its_state(
        db, kafka_went_down, client):
    orders = make_pipeline("orders")
    state = orders.desired_state
    client.force_login(make_operator())
    for step in ("preview", "execute"):
        response = client.post("/pipelines/orders/rewind/", {"mode": "to-earliest", "step": step},
                               HTTP_HX_REQUEST="true")
        assert response.status_code == 503
        assert rewind_refusals()[-1].message in html.unescape(response.content.decode())
    assert [e.dry_run for e in rewind_refusals()] == [True, False]
    orders.refresh_from_db()
    assert orders.desired_state == state
    assert set(orders.offsets.values_list("next_offset", flat=True)) == {100}


def test_a_rewind_from_the_api_answers_503_with_the_reason_and_is_audited(db, kafka_went_down, client):
    make_pipeline("orders")
    client.force_login(make_operator())
    response = client.post("/api/pipelines/orders/rewind", {"mode": "to-earliest", "dry_run": False},
                           content_type="application/json")
    assert_documented(operation("post", "/api/pipelines/{name}/rewind"), response, "post",
                      "/api/pipelines/orders/rewind")
    assert response.status_code == 503
    [entry] = rewind_refusals()
    assert response.json() == {"error": entry.message, "action_id": entry.pk}


def test_the_rewind_command_exits_1_with_the_reason_and_is_audited(transactional_db, kafka_went_down, capsys):
    make_pipeline("orders")
    code, _, err = run_command(capsys, "rewind", "orders", "--to-earliest", "--execute")
    [entry] = rewind_refusals()
    assert code == 1
    assert f"Refused: {entry.message}" in err and "Traceback" not in err


def test_the_admin_rewind_action_reports_the_refusal_of_each_pipeline(db, kafka_went_down):
    orders = make_pipeline("orders")
    client = client_of(staff_operator())
    preview = post_action(client, PIPELINES, "rewind", [orders.pk], mode="to-earliest", partitions="", step="preview")
    assert preview.status_code == 200
    executed = post_action(client, PIPELINES, "rewind", [orders.pk], mode="to-earliest", partitions="",
                           step="execute")
    first, second = rewind_refusals()
    assert first.message in html.unescape(preview.content.decode())
    assert messages_of(executed) == [f"Pipeline orders: rewind refused: {second.message}"]


# Tracing reads Kafka and changes nothing: the same refusal, with no action log entry.

@pytest.mark.parametrize("query", ["partition=0&offset=2", "key=k7"])
def test_a_trace_from_its_page_answers_503_in_the_panel(db, kafka_went_down, client, query):
    make_pipeline("orders")
    client.force_login(make_viewer())
    response = client.get(f"/pipelines/orders/trace/?{query}", HTTP_HX_REQUEST="true")
    assert response.status_code == 503
    assert "Kafka: KafkaTimeoutError: Unable to bootstrap" in html.unescape(response.content.decode())


@pytest.mark.parametrize("query", ["partition=0&offset=2", "key=k7"])
def test_a_trace_from_the_api_answers_503_with_the_reason(db, kafka_went_down, client, query):
    make_pipeline("orders")
    client.force_login(make_viewer())
    response = get_documented(client, "/api/pipelines/{name}/trace", f"/api/pipelines/orders/trace?{query}")
    assert response.status_code == 503
    assert kafka_refusal(response.json()["error"]) and response.json()["field"] is None


def test_the_trace_command_exits_1_with_the_reason(transactional_db, kafka_went_down, capsys):
    make_pipeline("orders")
    code, _, err = run_command(capsys, "trace", "orders", "--partition", "0", "--offset", "2")
    assert code == 1
    assert "Refused: Kafka: KafkaTimeoutError: Unable to bootstrap" in err and "Traceback" not in err


def test_a_watch_trace_answers_503_on_its_page_and_from_the_api(db, kafka_went_down, client):
    watch = Watch.objects.create(name="team", group_id="team-loader", topic="team-topic", sink_table="sink_team",
                                 record_id="value", row_id="id")
    WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=10)
    client.force_login(make_operator())
    page = client.get("/watches/team/trace/?partition=0&offset=2", HTTP_HX_REQUEST="true")
    assert page.status_code == 503
    assert "Kafka: KafkaTimeoutError: Unable to bootstrap" in html.unescape(page.content.decode())
    api = get_documented(client, "/api/watches/{name}/trace", "/api/watches/team/trace?partition=0&offset=2")
    assert api.status_code == 503 and kafka_refusal(api.json()["error"])


# Creating a pipeline or a watch checks the topic in Kafka first: in that window its answer is already a problem of
# the field `topic` naming Kafka (kafka_admin.topic_partitions_or_problem, pipeline_preview.preview), never a 500.

@pytest.fixture
def json_table(db):
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE sink_went_down (order_id bigint, source_topic text NOT NULL, "
                       "source_partition integer NOT NULL, source_offset bigint NOT NULL)")
    return "sink_went_down"


@pytest.mark.parametrize("path,spec", [
    ("/api/pipelines/", {"name": "more", "topic": "more-topic", "sink_table": "sink_more", "create_table": True}),
    ("/api/pipelines/preview", {"name": "more", "topic": "more-topic", "sink_table": "sink_went_down",
                                "transform": "json"}),
    ("/api/watches/", {"name": "team", "group": "team-loader", "topic": "more-topic"}),
])
def test_creating_or_previewing_answers_400_naming_kafka_for_the_topic(json_table, kafka_went_down, client, path,
                                                                        spec):
    client.force_login(make_operator())
    response = client.post(path, spec, content_type="application/json")
    assert response.status_code == 400
    [problem] = response.json()["errors"]["topic"]
    assert "KafkaTimeoutError: Unable to bootstrap" in problem["message"], problem


def test_the_groups_list_answers_503_and_a_group_page_shows_why_it_could_not_be_described(
        db, kafka_went_down, client):
    client.force_login(make_viewer())
    listed = get_documented(client, "/api/groups/", "/api/groups/")
    assert listed.status_code == 503 and "KafkaTimeoutError" in listed.json()["error"]
    described = client.get("/api/groups/billing/")
    assert described.status_code == 200 and any("KafkaTimeoutError" in e for e in described.json()["errors"])


def test_a_watch_whose_topic_was_found_just_before_kafka_went_down_answers_400_naming_kafka(
        db, kafka_went_down, client, monkeypatch):
    monkeypatch.setattr(kafka_admin, "topic_partitions_or_problem", lambda topic, cluster=None: ([0, 1], None))
    client.force_login(make_operator())
    response = client.post("/api/watches/", {"name": "team", "group": "team-loader", "topic": "more-topic"},
                           content_type="application/json")
    assert response.status_code == 400
    [problem] = response.json()["errors"]["topic"]
    assert problem["message"].startswith("cannot read the offsets of topic 'more-topic' in Kafka: KafkaTimeoutError")
    assert not Watch.objects.exists()


# A replay of dead letters from Kafka reads their records first: Kafka down is the same 503 (exit 1, a message in the
# admin), audited, before anything changes. It was a 409 "Kafka did not answer", as if the request were wrong.

def replay_refusals() -> list[ActionLog]:
    entries = list(ActionLog.objects.filter(action="replay_dead_letters").order_by("pk"))
    assert all(e.result == ActionResult.REFUSED and kafka_refusal(e.message) for e in entries), \
        [(e.result, e.message) for e in entries]
    return entries


@pytest.mark.parametrize("body", [{"ids": ["LETTER"], "source": "kafka"},
                                  {"filter": {"partition": 0}, "count": 3, "source": "kafka"}])
def test_a_replay_from_kafka_from_the_api_answers_503_with_the_reason_audited_and_changes_nothing(
        kafka_went_down, client, letters, body):  # noqa: F811
    client.force_login(make_operator())
    body = {**body, **({"ids": [letters[(0, 3)].pk]} if "ids" in body else {})}
    before = snapshot()
    path = "/api/pipelines/orders/dead-letters/replay"
    response = client.post(path, body, content_type="application/json")
    assert_documented(operation("post", "/api/pipelines/{name}/dead-letters/replay"), response, "post", path)
    assert response.status_code == 503
    [entry] = replay_refusals()
    assert response.json() == {"error": entry.message, "action_id": entry.pk}
    assert "KafkaTimeoutError: Unable to bootstrap" in entry.message
    assert snapshot() == before


@pytest.mark.django_db(transaction=True)   # a command closes the database connections when it ends
def test_the_dead_letters_command_replaying_from_kafka_exits_1_with_the_reason(kafka_went_down, capsys,
                                                                              letters):  # noqa: F811
    before = snapshot()
    code, _, err = run_command(capsys, "dead_letters", "orders", "replay", "--ids", str(letters[(0, 3)].pk),
                               "--from-kafka")
    [entry] = replay_refusals()
    assert code == 1
    assert f"Refused: {entry.message}" in err and "Traceback" not in err
    assert snapshot() == before


def test_the_admins_replay_from_kafka_reports_the_refusal(kafka_went_down, letters):  # noqa: F811
    before = snapshot()
    done = post_action(client_of(staff_operator()), "/admin/consumers/deadletter/", "replay_dead_letters_from_kafka",
                       [letters[(0, 3)].pk], step="execute", expected="1")
    [entry] = replay_refusals()
    assert messages_of(done) == [f"Pipeline orders: replay refused: {entry.message}"]
    assert snapshot() == before


def test_a_watch_check_kafka_cannot_answer_says_why_in_its_json_as_the_api_does(transactional_db, kafka_went_down,
                                                                                 capsys, client):
    """`watch check --json` prints the report, then exits 1 with the reason on stderr: a script reading only the
    JSON learns the reason from its `error` (null when the check did not fail), the API's answer has the same."""
    watch = Watch.objects.create(name="team", group_id="team-loader", topic="team-topic", sink_table="sink_team",
                                 record_id="value", row_id="id")
    WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=10)
    code, out, err = run_command(capsys, "watch", "check", "team", "--json")
    report = json.loads(out)
    assert code == 1 and report["status"] == "ERR"
    assert report["error"].startswith("Kafka: KafkaTimeoutError") and f"Refused: watch team: {report['error']}" in err
    client.force_login(make_operator())
    api = client.post("/api/watches/team/check", {}, content_type="application/json")
    assert_documented(operation("post", "/api/watches/{name}/check"), api, "post", "/api/watches/team/check")
    assert api.status_code == 200 and api.json().keys() == report.keys()
    assert api.json()["error"].startswith("Kafka: KafkaTimeoutError")
