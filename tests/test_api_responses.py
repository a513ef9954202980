"""The OpenAPI schema describes every answer the API gives: after real history (a pipeline that consumed a topic
with a poison record, reconciled, rewound and paused; a team's group on the same topic; a watch of it; an alert;
a channel), every operation is called, successes and refusals alike, and each answer's status must be listed in
the schema and its body must match that status's declared shape (tests/api_schema.py)."""
import json

import pytest
from django.test import Client
from django.utils import timezone

from alerts.models import Alert, AlertRule, AlertState, RuleKind
from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.models import DeadLetter
from consumers.reconciliation.reconcile import reconcile_pipeline
from consumers.reconciliation.snapshots import take_snapshots
from tests.api_schema import RAW_SCHEMA, assert_documented, body, operation
from tests.new_states import make_new_states
from tests.pipelines import create_pipeline
from tests.sink_rows import made_sink_table
from tests.views_helpers import api_token, drop_sink, make_operator, make_viewer, produce

pytestmark = [pytest.mark.kafka]


@pytest.fixture
def history(transactional_db, kafka_bootstrap, make_topic):
    topic = make_topic("schema")
    produce(kafka_bootstrap, topic, ["1", "2", "x3", "4", "5", "6"])
    pipeline = create_pipeline("schema-orders", topic, "sink_schema_orders", "int_value", batch_size=2)
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    reconcile_pipeline(pipeline)
    kafka_admin.commit_offsets("team-loader", topic, {0: 4})
    take_snapshots()
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline)
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="1 lost",
                                 started_at=now, last_seen_at=now)
    yield pipeline, topic, alert
    drop_sink(pipeline.sink_table)


def test_every_answer_after_real_history_is_one_the_schema_documents(history):
    pipeline, topic, alert = history
    name, letter = pipeline.name, DeadLetter.objects.get(pipeline=pipeline).pk
    operator, viewer, anonymous = Client(), Client(), Client()
    otto = make_operator()
    operator.force_login(otto)
    viewer.force_login(make_viewer())
    by_token = Client(HTTP_AUTHORIZATION=f"Token {api_token(otto)}")
    p, w = "/api/pipelines/{name}/", "/api/watches/{name}/"
    calls = [
        # (client, method, schema path, path, JSON body, expected status)
        (operator, "GET", "/api/", "/api/", None, 200),
        (operator, "GET", "/api/me", "/api/me", None, 200),
        (anonymous, "GET", "/api/me", "/api/me", None, 403),
        (anonymous, "POST", "/api/token", "/api/token", {"username": "otto", "password": "wrong"}, 400),
        (operator, "DELETE", "/api/token", "/api/token", None, 400),   # a session has no token to revoke
        (by_token, "DELETE", "/api/token", "/api/token", None, 204),
        (operator, "GET", "/api/pipelines/", "/api/pipelines/", None, 200),
        (operator, "POST", "/api/pipelines/preview", "/api/pipelines/preview",
         {"name": "preview", "topic": topic, "sink_table": "sink_schema_orders"}, 200),
        (operator, "POST", "/api/pipelines/", "/api/pipelines/", {"name": "schema-more", "topic": topic,
                                                                 "sink_table": "sink_schema_more",
                                                                 "create_table": True}, 201),
        (operator, "POST", "/api/pipelines/", "/api/pipelines/", {"name": "schema-more", "topic": topic,
                                                                 "sink_table": "auth_user"}, 400),
        (operator, "GET", p, f"/api/pipelines/{name}/", None, 200),
        (operator, "GET", p, "/api/pipelines/nowhere/", None, 404),
        (operator, "GET", p + "reconciliation", f"/api/pipelines/{name}/reconciliation", None, 200),
        (operator, "POST", p + "reconciliation", f"/api/pipelines/{name}/reconciliation", {"full": True}, 200),
        (operator, "GET", p + "trace", f"/api/pipelines/{name}/trace?partition=0&offset=2", None, 200),
        (operator, "GET", p + "trace", f"/api/pipelines/{name}/trace?key=nothing", None, 200),
        (operator, "GET", p + "trace", f"/api/pipelines/{name}/trace?partition=x", None, 400),
        (operator, "GET", p + "dead-letters", f"/api/pipelines/{name}/dead-letters?limit=1", None, 200),
        (operator, "GET", p + "dead-letters", f"/api/pipelines/{name}/dead-letters?limit=0", None, 400),
        (operator, "POST", p + "dead-letters/replay", f"/api/pipelines/{name}/dead-letters/replay",
         {"ids": [letter]}, 200),
        (operator, "POST", p + "dead-letters/discard", f"/api/pipelines/{name}/dead-letters/discard",
         {"ids": [letter], "reason": "test data"}, 200),
        (operator, "POST", p + "dead-letters/discard", f"/api/pipelines/{name}/dead-letters/discard",
         {"ids": [letter + 1000], "reason": "not this pipeline's"}, 409),
        (viewer, "POST", p + "dead-letters/replay", f"/api/pipelines/{name}/dead-letters/replay", {"ids": [1]}, 403),
        (operator, "POST", p + "rewind", f"/api/pipelines/{name}/rewind", {"mode": "to-earliest"}, 200),
        (operator, "POST", p + "rewind", f"/api/pipelines/{name}/rewind", {"mode": "to-offset", "value": "999"},
         409),
        (operator, "POST", p + "actions/{action}", f"/api/pipelines/{name}/actions/start", {}, 200),
        (operator, "POST", p + "actions/{action}", f"/api/pipelines/{name}/actions/pause", {}, 200),
        (operator, "POST", p + "actions/{action}", f"/api/pipelines/{name}/actions/pause", {}, 409),
        (operator, "POST", p + "actions/{action}", f"/api/pipelines/{name}/actions/stop", {}, 200),
        (operator, "GET", p + "topic-checks", f"/api/pipelines/{name}/topic-checks", None, 200),
        # (queued checks run on Spark in a worker: test_topic_check_job.py; here, the refusal's shape)
        (viewer, "POST", p + "topic-checks", f"/api/pipelines/{name}/topic-checks", {}, 403),
        (operator, "GET", "/api/clusters/", "/api/clusters/", None, 200),
        (operator, "GET", "/api/groups/", "/api/groups/", None, 200),
        (operator, "GET", "/api/groups/{group_id}/", "/api/groups/team-loader/", None, 200),
        (operator, "GET", "/api/groups/{group_id}/", "/api/groups/team-loader/?cluster=nowhere", None, 400),
        (operator, "GET", "/api/groups/{group_id}/", "/api/groups/nobody/", None, 404),
        (operator, "POST", "/api/groups/{group_id}/reset", "/api/groups/nobody/reset",
         {"topic": topic, "mode": "to-earliest"}, 404),
        (operator, "POST", "/api/groups/{group_id}/reset", "/api/groups/team-loader/reset",
         {"topic": topic, "mode": "to-earliest"}, 200),
        (operator, "POST", "/api/watches/", "/api/watches/", {"name": "team", "group": "team-loader", "topic": topic,
                                                             "sink_table": "sink_schema_orders", "record_id": "value",
                                                             "row_id": "id", "settle_seconds": 0}, 201),
        (operator, "GET", "/api/watches/", "/api/watches/", None, 200),
        (operator, "POST", w + "check", "/api/watches/team/check", {}, 200),
        (operator, "GET", w, "/api/watches/team/", None, 200),
        (operator, "GET", w + "trace", "/api/watches/team/trace?partition=0&offset=2", None, 200),
        (operator, "GET", w + "trace", "/api/watches/team/trace?partition=x", None, 400),
        (operator, "GET", w + "findings.csv", "/api/watches/team/findings.csv", None, 200),
        (operator, "DELETE", w, "/api/watches/team/", None, 200),
        (operator, "GET", "/api/action-log", "/api/action-log?limit=5", None, 200),
        (operator, "GET", "/api/action-log", "/api/action-log?pipeline=nobody", None, 400),
        (operator, "GET", "/api/alerts/", "/api/alerts/", None, 200),
        (operator, "GET", "/api/alerts/{alert_id}/", f"/api/alerts/{alert.pk}/", None, 200),
        (operator, "POST", "/api/alerts/{alert_id}/mute/", f"/api/alerts/{alert.pk}/mute/", {"minutes": 5}, 200),
        (operator, "POST", "/api/alerts/{alert_id}/acknowledge/", f"/api/alerts/{alert.pk}/acknowledge/", {}, 200),
        (operator, "POST", "/api/alerts/{alert_id}/acknowledge/", f"/api/alerts/{alert.pk}/acknowledge/", {}, 409),
        (operator, "POST", "/api/alerts/channels/", "/api/alerts/channels/",
         {"name": "ops", "kind": "webhook", "url": "http://127.0.0.1:9/hook"}, 201),
        (operator, "POST", "/api/alerts/channels/", "/api/alerts/channels/", {"name": "ops", "kind": "webhook",
                                                                             "url": "http://127.0.0.1:9/hook"}, 409),
        (operator, "GET", "/api/alerts/channels/", "/api/alerts/channels/", None, 200),
        (operator, "GET", "/api/alerts/channels/{name}/", "/api/alerts/channels/ops/", None, 200),
        (operator, "POST", "/api/alerts/channels/{name}/test/", "/api/alerts/channels/ops/test/", None, 502),
        (operator, "DELETE", "/api/alerts/channels/{name}/", "/api/alerts/channels/ops/", None, 204),
    ]
    called = set()
    for client, method, template, path, data, expected in calls:
        response = client.generic(method, path, data="" if data is None else json.dumps(data),
                                  content_type="application/json")
        assert response.status_code == expected, (method, path, response.status_code, body(response)[:400])
        assert_documented(operation(method, template), response, method, path)
        called.add((method, template))
    every = {(method.upper(), path) for path, methods in RAW_SCHEMA["paths"].items() for method in methods}
    assert every - called == set(), "operations this test does not call"


@pytest.fixture
def new_states(transactional_db, settings, tmp_path):
    return make_new_states(settings, tmp_path)


def test_every_answer_about_the_new_states_is_one_the_schema_documents(new_states):
    """Topic checks failed, running and queued; an alert acknowledged to its channels and one paged through its
    notifications; watches never checked or grown; a JSON pipeline in epoch seconds; a pipeline whose cluster's
    password file is gone, refused up front."""
    operator = Client()
    operator.force_login(make_operator())
    p, a = "/api/pipelines/{name}/", "/api/alerts/{alert_id}/"
    broken, acknowledged, noisy = new_states.broken.name, new_states.acknowledged.pk, new_states.noisy.pk
    calls = [
        ("GET", "/api/pipelines/", "/api/pipelines/", None, 200),
        ("GET", p, f"/api/pipelines/{new_states.json_pipeline.name}/", None, 200),
        ("GET", p, f"/api/pipelines/{broken}/", None, 200),
        ("GET", p + "topic-checks", "/api/pipelines/orders/topic-checks", None, 200),
        ("POST", p + "topic-checks", f"/api/pipelines/{broken}/topic-checks", {}, 409),
        ("POST", p + "actions/{action}", f"/api/pipelines/{broken}/actions/start", {}, 409),
        ("POST", p + "actions/{action}", f"/api/pipelines/{broken}/actions/restart", {}, 409),
        ("POST", p + "rewind", f"/api/pipelines/{broken}/rewind", {"mode": "to-earliest"}, 409),
        ("POST", p + "rewind", f"/api/pipelines/{broken}/rewind", {"mode": "to-earliest", "dry_run": False}, 409),
        ("GET", "/api/alerts/", "/api/alerts/?state=all", None, 200),
        ("GET", a, f"/api/alerts/{acknowledged}/", None, 200),
        ("POST", a + "acknowledge/", f"/api/alerts/{acknowledged}/acknowledge/", {}, 409),
        ("GET", a, f"/api/alerts/{noisy}/", None, 200),
        ("GET", a, f"/api/alerts/{noisy}/?limit=20&page=2", None, 200),
        ("GET", a, f"/api/alerts/{noisy}/?limit=20&page=4", None, 200),
        ("GET", a, f"/api/alerts/{noisy}/?limit=0", None, 400),
        ("GET", a, f"/api/alerts/{noisy}/?page=x", None, 400),
        ("GET", "/api/alerts/channels/", "/api/alerts/channels/", None, 200),
        ("GET", "/api/watches/", "/api/watches/", None, 200),
        ("GET", "/api/watches/{name}/", "/api/watches/never/", None, 200),
        ("GET", "/api/watches/{name}/", "/api/watches/grown/", None, 200),
        ("GET", "/api/action-log", "/api/action-log?limit=50", None, 200),
    ]
    for method, template, path, data, expected in calls:
        response = operator.generic(method, path, data="" if data is None else json.dumps(data),
                                    content_type="application/json")
        assert response.status_code == expected, (method, path, response.status_code, body(response)[:400])
        assert_documented(operation(method, template), response, method, path)
    pages = [operator.get(f"/api/alerts/{noisy}/?limit=20&page={n}").json() for n in (1, 2, 3)]
    assert [len(page["notifications"]) for page in pages] == [20, 20, 20]
    assert pages[0]["notifications_next"].endswith(f"/api/alerts/{noisy}/?limit=20&page=2")
    assert pages[2]["notifications_next"] is None


def test_a_preview_with_notes_is_an_answer_the_schema_documents(transactional_db, kafka_bootstrap, make_topic):
    topic = make_topic("schema-seconds")
    produce(kafka_bootstrap, topic, [json.dumps({"id": n, "created_at": 1_700_000_000 + n}) for n in range(3)])
    operator = Client()
    operator.force_login(make_operator())
    with made_sink_table("schema_seconds", "id bigint NOT NULL, created_at timestamptz") as table:
        for mapping, notes in (({}, 1), ({"created_at": "created_at::seconds"}, 0)):
            response = operator.post("/api/pipelines/preview", {"name": "seconds", "topic": topic, "sink_table": table,
                                                                "transform": "json", "map": mapping},
                                     content_type="application/json")
            assert response.status_code == 200, body(response)[:400]
            assert_documented(operation("POST", "/api/pipelines/preview"), response, "POST", "/api/pipelines/preview")
            assert len(response.json()["notes"]) == notes



def test_the_alert_detail_says_which_notifications_were_delivered_and_which_were_given_up(new_states):
    """An acknowledge PagerDuty took and one Slack refused until the outbox gave it up: a client must tell the
    second from a message still being retried (both have no delivered_at)."""
    operator = Client()
    operator.force_login(make_operator())
    answer = operator.get(f"/api/alerts/{new_states.acknowledged.pk}/")
    assert_documented(operation("GET", "/api/alerts/{alert_id}/"), answer, "GET", "/api/alerts/ID/")
    shown = {(n["channel"], n["kind"]): n for n in answer.json()["notifications"]}
    pager, chat = shown[("pager", "acknowledged")], shown[("chat", "acknowledged")]
    assert pager["delivered_at"] is not None and pager["failed_at"] is None
    assert chat["delivered_at"] is None and chat["failed_at"] is not None and chat["last_error"] == "HTTP 500: ok"
