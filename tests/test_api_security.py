"""Bad input and outages at the API and the pages: strict JSON types, 4xx never 500, nothing moves before
validation, every refusal in the action log, throttled logins and tokens, GET never writes, and a task broker that
is down makes an action "failed" (with the reason), never "done"."""
import socket
from datetime import UTC, datetime

import pytest
import time_machine
from django.core.cache import cache
from django.test import Client

from consumers.models import (
    ActionLog,
    DesiredState,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
    TopicCheckJob,
    TopicCheckStatus,
)
from tests.conftest import drop_broker_connections
from tests.views_helpers import (  # noqa: F401 - fresh_throttles: an autouse fixture
    PASSWORD,
    fresh_throttles,
    make_operator,
    make_pipeline,
    make_viewer,
)


@pytest.fixture
def orders(db):
    pipeline = make_pipeline()
    return pipeline, dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))


def post_json(client, url, body):
    import json

    return client.post(url, json.dumps(body), content_type="application/json")


def assert_nothing_moved(pipeline, offsets):
    assert dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset")) == offsets
    assert not ActionLog.objects.exclude(result="refused").exists()


@pytest.mark.parametrize("field", ["dry_run", "rollback_sink"])
@pytest.mark.parametrize("value", ["no", "false", "true", 0, 1, None, [], {}, "on"])
def test_rewind_booleans_are_json_booleans_only(operator_client, orders, field, value):
    pipeline, offsets = orders
    response = post_json(operator_client, "/api/pipelines/orders/rewind", {"mode": "to-earliest", field: value})
    assert response.status_code == 400
    assert list(response.json()["errors"]) == [field]
    message = response.json()["errors"][field][0]["message"]
    assert "true or false" in message or (value is None and "may not be null" in message)
    assert_nothing_moved(pipeline, offsets)


@pytest.mark.parametrize("body,field", [
    ({"mode": "to-datetime", "value": "1969-12-31T23:59:59Z"}, "value"),
    ({"mode": "to-datetime", "value": "0001-01-01T00:00:00+01:00"}, "value"),
    ({"mode": "by-duration", "value": "P999999999D"}, "value"),
    ({"mode": "by-duration", "value": "P99999999999999999D"}, "value"),
    ({"mode": "by-duration", "value": "PT99999999999999999999H"}, "value"),
    ({"mode": "to-offset", "value": 2**63}, "value"),
    ({"mode": "shift-by", "value": "-99999999999999999999"}, "value"),
    ({"mode": "to-offset", "value": "1\u0000"}, "value"),
    ({"mode": "to-offset", "value": 1.5}, "value"),
    ({"mode": "to-earliest", "partitions": [True]}, "partitions"),
    ({"mode": "to-earliest", "partitions": "0"}, "partitions"),
    ({"mode": "to-earliest", "partitions": [2**40]}, "partitions"),
    ({"mode": "rewind-everything"}, "mode"),
    ({"mode": "to-earliest", "dryrun": False}, "dryrun"),
])
def test_bad_rewind_targets_are_refused_naming_the_field_before_anything_moves(operator_client, orders, body, field):
    pipeline, offsets = orders
    response = post_json(operator_client, "/api/pipelines/orders/rewind", {**body, "dry_run": False})
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"]
    assert_nothing_moved(pipeline, offsets)
    refusal = ActionLog.objects.get()
    assert (refusal.actor, refusal.action, refusal.result, refusal.pipeline) == ("otto", "rewind", "refused", pipeline)
    assert refusal.message.startswith("bad input:") and field in refusal.message


@pytest.mark.parametrize("url", ["/api/pipelines/orders/rewind", "/api/pipelines/orders/actions/start",
                                 "/api/groups/billing/reset", "/api/pipelines/orders/reconciliation",
                                 "/api/pipelines/orders/topic-checks"])
@pytest.mark.parametrize("body", [[], ["mode"], "to-earliest", 42, None, True])
def test_a_body_that_is_not_a_json_object_is_a_400(operator_client, orders, url, body):
    pipeline, offsets = orders
    response = post_json(operator_client, url, body)
    assert response.status_code == 400, (url, body, response.content)
    assert_nothing_moved(pipeline, offsets)
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED


def test_malformed_json_and_alert_mutes_of_non_objects_are_400s(operator_client, orders):
    bad = operator_client.post("/api/pipelines/orders/rewind", "{not json", content_type="application/json")
    assert bad.status_code == 400
    assert post_json(operator_client, "/api/alerts/1/mute/", [1]).status_code in (400, 404)


@pytest.mark.parametrize("url", ["/api/action-log?pipeline=%00", "/api/action-log?group=a%00b",
                                 "/api/alerts/?pipeline=%00", "/api/action-log?limit=%00", "/?pipeline=%00",
                                 "/action-log/?pipeline=%00",
                                 "/topic-checks/?pipeline=%00", "/api/groups/a%00b/", "/alerts/?pipeline=%00"])
def test_a_nul_character_anywhere_in_the_url_is_a_400(viewer_client, orders, url):
    assert viewer_client.get(url).status_code == 400


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "limit=501", "limit=99999999999999999999999"])
def test_the_action_log_refuses_a_bad_limit(viewer_client, query):
    response = viewer_client.get(f"/api/action-log?{query}")
    assert response.status_code == 400 and "limit" in response.json()["errors"]


def test_a_nul_character_in_a_form_post_is_a_400_and_nothing_moves(operator_client, orders):
    pipeline, offsets = orders
    response = operator_client.post("/pipelines/orders/rewind/", {"mode": "to-offset", "value": "1\x00",
                                                                  "step": "execute"})
    assert response.status_code == 400
    assert_nothing_moved(pipeline, offsets)


def test_a_bad_rewind_form_on_the_page_is_refused_and_logged(operator_client, orders):
    pipeline, offsets = orders
    response = operator_client.post("/pipelines/orders/rewind/",
                                    {"mode": "to-datetime", "value": "1960-01-01T00:00:00Z", "step": "execute"})
    assert response.status_code == 422 and "before 1970" in response.content.decode()
    assert_nothing_moved(pipeline, offsets)
    assert ActionLog.objects.get().message.startswith("bad input: value: to-datetime 1960")


def test_get_reconciliation_reads_the_stored_report_and_writes_nothing(viewer_client, operator_client, orders):
    pipeline, _ = orders
    health = (PipelineHealth.objects.count(), PartitionHealth.objects.count(),
              list(PartitionHealth.objects.values_list("checked_at", flat=True)))
    report = viewer_client.get("/api/pipelines/orders/reconciliation?full=1").json()
    assert report["pipelines"][0]["name"] == "orders" and report["pipelines"][0]["status"] == "OK"
    assert report["pipelines"][0]["lag_records"] == 40 and report["pipelines"][0]["partitions"][0]["lag_records"] == 20
    assert (PipelineHealth.objects.count(), PartitionHealth.objects.count(),
            list(PartitionHealth.objects.values_list("checked_at", flat=True))) == health
    # Reconciling now is an action: operators only, a strict boolean for "full".
    assert post_json(viewer_client, "/api/pipelines/orders/reconciliation", {"full": True}).status_code == 403
    assert post_json(operator_client, "/api/pipelines/orders/reconciliation", {"full": "1"}).status_code == 400


@pytest.fixture
def broker_down(settings):
    """The Celery broker pointed at a closed port: Redis is down."""
    from tally.celery import app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    original = app.conf.broker_url, app.conf.broker_connection_timeout
    app.conf.broker_url = f"redis://127.0.0.1:{closed}/0"
    app.conf.broker_connection_timeout = 1
    drop_broker_connections(app)
    yield
    app.conf.broker_url, app.conf.broker_connection_timeout = original
    drop_broker_connections(app)


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_a_start_is_recorded_failed_with_the_reason(broker_down):
    make_pipeline()
    client = Client()
    client.force_login(make_operator())
    response = client.post("/api/pipelines/orders/actions/start")
    assert response.status_code == 503
    entry = ActionLog.objects.get()
    assert entry.result == "failed" and "task broker is unreachable" in entry.message
    assert response.json()["result"] == "failed"
    assert "run not enqueued" in Pipeline.objects.get().last_error
    page = client.post("/pipelines/orders/actions/restart/", follow=True).content.decode()
    assert "no run was enqueued" in page


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_the_cli_start_exits_1_with_the_reason_on_stderr(broker_down):
    """A script starting a pipeline must not read "done" (exit 0) from a start the action log records failed."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    make_pipeline()
    with pytest.raises(CommandError, match="task broker is unreachable") as raised:
        call_command("pipeline", "start", "orders")
    assert raised.value.returncode == 1
    assert ActionLog.objects.get().result == "failed"


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_the_action_log_never_says_a_run_was_enqueued(broker_down):
    make_pipeline()
    client = Client()
    client.force_login(make_operator())
    assert client.post("/api/pipelines/orders/actions/start").status_code == 503
    message = ActionLog.objects.get().message
    assert "no run was enqueued" in message and "run(s) enqueued" not in message


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_a_topic_check_is_failed_at_once_not_queued_forever(broker_down):
    make_pipeline()
    client = Client()
    client.force_login(make_operator())
    response = post_json(client, "/api/pipelines/orders/topic-checks", {})
    assert response.status_code == 503
    job = TopicCheckJob.objects.get()
    assert job.status == TopicCheckStatus.FAILED and "task broker is unreachable" in job.error
    page = client.post("/topic-checks/request/", {"pipeline": "orders", "next": "/pipelines/orders/"}, follow=True)
    assert "was not queued" in page.content.decode()
    assert not TopicCheckJob.objects.filter(status=TopicCheckStatus.QUEUED).exists()


def locked_out(client, url, failed_status):
    """otto's four wrong passwords at `url` are answered `failed_status`, the fifth 429; then his right password
    is refused too (429): that answer."""
    for _ in range(4):
        assert client.post(url, {"username": "otto", "password": "wrong"}).status_code == failed_status
    assert client.post(url, {"username": "otto", "password": "wrong"}).status_code == 429
    locked = client.post(url, {"username": "otto", "password": PASSWORD})
    assert locked.status_code == 429
    return locked


def test_logins_are_locked_out_after_repeated_failures(db):
    make_operator()
    client = Client()
    locked = locked_out(client, "/accounts/login/", failed_status=200)
    assert "Too many failed logins" in locked.content.decode()
    assert "_auth_user_id" not in client.session
    # Another user from the same address is not locked out by otto's failures.
    make_viewer()
    assert client.post("/accounts/login/", {"username": "vera", "password": PASSWORD}).status_code == 302


def test_the_token_endpoint_is_locked_out_and_throttled(db):
    # The throttle counts per minute and each attempt hashes a password: on a busy machine twelve attempts
    # can take longer than the window, so the clock stands still.
    with time_machine.travel(datetime(2030, 1, 1, 12, tzinfo=UTC), tick=False):
        token_endpoint_is_locked_out_and_throttled()


def token_endpoint_is_locked_out_and_throttled():
    cache.clear()
    make_operator()
    client = Client()
    locked = locked_out(client, "/api/token", failed_status=400)
    assert "token" not in locked.json()
    cache.clear()
    statuses = [client.post("/api/token", {"username": f"nobody{i}", "password": "x"}).status_code for i in range(12)]
    assert statuses[:10] == [400] * 10 and statuses[10:] == [429, 429]  # scope "token": 10 a minute


def test_password_reset_is_offered_only_when_email_is_configured(client, db, settings):
    settings.EMAIL_CONFIGURED = False
    assert client.get("/accounts/password_reset/").status_code == 404
    assert "Forgot your password" not in client.get("/accounts/login/").content.decode()
    settings.EMAIL_CONFIGURED = True
    assert client.get("/accounts/password_reset/").status_code == 200
    assert "Forgot your password" in client.get("/accounts/login/").content.decode()


def test_the_api_schema_and_its_docs_page_are_served_and_linked(viewer_client):
    schema = viewer_client.get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    rewind = paths["/api/pipelines/{name}/rewind"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert rewind["$ref"].endswith("/RewindInput")
    assert schema.json()["components"]["schemas"]["RewindInput"]["properties"]["dry_run"]["type"] == "boolean"
    docs = viewer_client.get("/api/docs/").content.decode()
    assert "/api/pipelines/{name}/rewind" in docs and "dry_run" in docs
    assert 'href="/api/docs/"' in viewer_client.get("/").content.decode()
    assert Client().get("/api/schema/").status_code in (401, 403)
