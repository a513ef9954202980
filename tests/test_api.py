"""The JSON API: reads for any signed-in user (session or token), actions for operators only (403 for
viewers), clear 400s for bad input, and real rewinds and reconciliation against the broker."""
import pytest
from django.test import Client
from django.utils import timezone

from consumers.models import ActionLog, DesiredState, PartitionOffset, Pipeline, TopicCheckJob, Watch
from tests.views_helpers import PASSWORD, consumed_pipeline, drop_sink, make_operator, make_pipeline


@pytest.mark.django_db
def test_anonymous_requests_are_refused(client):
    make_pipeline()
    assert client.get("/api/pipelines/").status_code in (401, 403)
    assert client.post("/api/pipelines/orders/actions/start").status_code in (401, 403)


@pytest.mark.django_db
def test_the_pipeline_list_has_status_lag_and_counts(viewer_client):
    make_pipeline("orders")
    make_pipeline("payments", lost=3, status="ERR")
    data = viewer_client.get("/api/pipelines/").json()
    by_name = {p["name"]: p for p in data["pipelines"]}
    assert by_name["payments"]["status"] == "ERR" and by_name["payments"]["lost"] == 3
    assert by_name["orders"]["lag_records"] == 40 and by_name["orders"]["lag_seconds"] == 12.5
    assert by_name["orders"]["last_reconciliation"] is not None


@pytest.mark.django_db
def test_a_pipeline_detail_has_per_partition_state_ledger_and_runs(viewer_client):
    make_pipeline("orders", lost=10, status="ERR")
    data = viewer_client.get("/api/pipelines/orders/").json()
    first = data["partitions"][0]
    assert (first["partition"], first["log_start"], first["high_watermark"], first["next_offset"],
            first["kafka_committed"], first["lag_records"], first["lost"]) == (0, 0, 120, 100, 100, 20, 10)
    assert first["findings"] == [{"kind": "lost", "start": 40, "end": 50, "count": 10}]
    ledger = data["ledger"][0]
    assert ledger["gaps"] == [[40, 50]] and ledger["overlaps"] == [[60, 65]] and ledger["rewinds"] == [80]
    assert data["runs"][0]["worker"] == "worker-a:4242"


@pytest.mark.django_db
def test_a_token_authenticates_scripts(client):
    make_pipeline()
    user = make_operator()
    response = client.post("/api/token", {"username": user.username, "password": PASSWORD})
    key = response.json()["token"]
    me = client.get("/api/me", HTTP_AUTHORIZATION=f"Token {key}").json()
    assert me == {"username": "otto", "role": "operator", "can_operate": True}


@pytest.mark.django_db
def test_a_viewer_gets_403_on_every_action_nothing_changes_and_each_refusal_is_audited(viewer_client):
    make_pipeline()
    for url in ("/api/pipelines/orders/actions/start", "/api/pipelines/orders/rewind",
                "/api/groups/some-group/reset"):
        response = viewer_client.post(url, {"mode": "to-earliest", "topic": "t"}, content_type="application/json")
        assert response.status_code == 403, url
        assert "Only operators may act" in response.json()["detail"]
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED
    refusals = list(ActionLog.objects.order_by("created_at").values_list("actor", "action", "result", "group_id"))
    assert refusals == [("vera", "start", "refused", ""), ("vera", "rewind", "refused", ""),
                        ("vera", "reset_group", "refused", "some-group")]
    assert all("viewer role" in m for m in ActionLog.objects.values_list("message", flat=True))


@pytest.mark.django_db
def test_a_refused_write_is_logged_under_the_action_its_success_is_logged_under(viewer_client):
    from alerts.models import Alert, AlertRule, Channel

    make_pipeline()
    rule = AlertRule.objects.create(name="loss", kind="lost")
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, pipeline=Pipeline.objects.get(), summary="x", facts={}, started_at=now,
                                 last_seen_at=now)
    Channel.objects.create(name="hooks", kind="webhook", url="https://example.com/in")
    Watch.objects.create(name="team", group_id="team-group", topic="team")
    writes = [("post", "/api/pipelines/", "create"), ("post", "/api/pipelines/orders/reconciliation", "reconcile"),
              ("post", "/api/pipelines/orders/topic-checks", "topic_check"),
              ("post", "/api/pipelines/orders/dead-letters/replay", "replay_dead_letters"),
              ("post", "/api/groups/g/reset", "reset_group"), ("post", "/api/watches/", "create_watch"),
              ("delete", "/api/watches/team/", "delete_watch"), ("post", "/api/watches/team/check", "check_watch"),
              ("post", f"/api/alerts/{alert.pk}/acknowledge/", "acknowledge_alert"),
              ("post", f"/api/alerts/{alert.pk}/mute/", "mute_alert"),
              ("post", "/api/alerts/channels/", "alert_channel_add"),
              ("delete", "/api/alerts/channels/hooks/", "alert_channel_delete"),
              ("post", "/api/alerts/channels/hooks/test/", "alert_channel_test")]
    for method, url, _ in writes:
        assert getattr(viewer_client, method)(url, {}, content_type="application/json").status_code == 403, url
    logged = list(ActionLog.objects.order_by("pk").values_list("action", "result"))
    assert logged == [(action, "refused") for _, _, action in writes]


@pytest.mark.django_db
def test_an_operator_starts_and_pauses_a_pipeline_and_a_refusal_is_409(operator_client):
    make_pipeline()
    started = operator_client.post("/api/pipelines/orders/actions/start")
    assert started.status_code == 200 and started.json()["result"] == "done"
    assert Pipeline.objects.get().desired_state == DesiredState.RUNNING
    refused = operator_client.post("/api/pipelines/orders/actions/resume")
    assert refused.status_code == 409 and "it is not paused" in refused.json()["error"]
    assert operator_client.post("/api/pipelines/orders/actions/explode").status_code == 404


@pytest.mark.django_db
def test_starting_a_pipeline_whose_cluster_is_not_configured_is_a_409_that_names_it(operator_client):
    Pipeline.objects.filter(pk=make_pipeline().pk).update(cluster="gone")
    refused = operator_client.post("/api/pipelines/orders/actions/start")
    assert refused.status_code == 409
    assert "Kafka cluster 'gone': no such cluster" in refused.json()["error"]
    assert "TALLY_KAFKA_CLUSTERS" in refused.json()["error"]
    assert (Pipeline.objects.get().desired_state, Pipeline.objects.get().epoch) == (DesiredState.STOPPED, 0)
    assert ActionLog.objects.get().result == "refused"


@pytest.mark.django_db
def test_a_topic_check_of_a_pipeline_whose_cluster_is_not_configured_is_refused_naming_it_and_queues_nothing(
        operator_client):
    """It was queued (202), to fail in the worker when Spark could not read the cluster: refused up front, as start
    and rewind are, from the API and from the page."""
    Pipeline.objects.filter(pk=make_pipeline().pk).update(cluster="gone")
    refused = operator_client.post("/api/pipelines/orders/topic-checks", {}, content_type="application/json")
    assert refused.status_code == 409
    assert refused.json()["error"].startswith("Cannot check the topic of pipeline 'orders': Kafka cluster 'gone': "
                                              "no such cluster (configured: default;")
    page = operator_client.post("/topic-checks/request/", {"pipeline": "orders", "next": "/"}, follow=True)
    assert "Kafka cluster &#x27;gone&#x27;: no such cluster" in page.content.decode()
    assert not TopicCheckJob.objects.exists()
    assert list(ActionLog.objects.values_list("action", "result")) == [("topic_check", "refused")] * 2


@pytest.mark.django_db
def test_an_action_on_something_that_does_not_exist_is_a_404_and_logged_as_refused(operator_client):
    make_pipeline()
    assert operator_client.post("/api/pipelines/orders/actions/explode").status_code == 404
    assert operator_client.post("/api/pipelines/nosuch/actions/start").status_code == 404
    assert operator_client.post("/api/pipelines/nosuch/rewind", {}, content_type="application/json").status_code == 404
    assert operator_client.post("/api/alerts/999999/acknowledge/").status_code == 404
    assert operator_client.get("/api/pipelines/nosuch/").status_code == 404   # a look, not an action: not logged
    refusals = ActionLog.objects.filter(result="refused").order_by("pk")
    assert [(r.action, r.params["path"]) for r in refusals] == [
        ("explode", "/api/pipelines/orders/actions/explode"), ("start", "/api/pipelines/nosuch/actions/start"),
        ("rewind", "/api/pipelines/nosuch/rewind"), ("acknowledge_alert", "/api/alerts/999999/acknowledge/")]
    assert all(r.message.startswith("not found: ") for r in refusals)
    assert "Unknown action 'explode'" in refusals[0].message


@pytest.mark.django_db
def test_session_posts_to_the_api_need_the_csrf_token():
    make_pipeline()
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())
    assert client.post("/api/pipelines/orders/actions/start").status_code == 403
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED


@pytest.mark.django_db
def test_bad_rewind_input_is_a_400_with_field_errors(operator_client):
    make_pipeline()
    response = operator_client.post("/api/pipelines/orders/rewind", {"mode": "to-offset", "value": "ten"},
                                    content_type="application/json")
    assert response.status_code == 400
    assert response.json()["errors"]["value"][0]["message"] == "to-offset needs an integer, got 'ten'."
    assert list(PartitionOffset.objects.values_list("next_offset", flat=True)) == [100, 100]


@pytest.mark.django_db
def test_the_action_log_lists_actions_newest_first_with_filters(operator_client):
    make_pipeline("orders")
    make_pipeline("payments")
    operator_client.post("/api/pipelines/orders/actions/start")
    operator_client.post("/api/pipelines/payments/actions/pause")
    entries = operator_client.get("/api/action-log").json()["actions"]
    assert [(e["pipeline"], e["action"], e["result"]) for e in entries] == [
        ("payments", "pause", "refused"), ("orders", "start", "done")]
    filtered = operator_client.get("/api/action-log?pipeline=orders").json()["actions"]
    assert [e["pipeline"] for e in filtered] == ["orders"]


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_a_rewind_dry_run_changes_nothing_and_the_execution_moves_the_position(operator_client, kafka_bootstrap,
                                                                                make_topic):
    topic = make_topic("api-rewind")
    pipeline = consumed_pipeline(kafka_bootstrap, topic, "api-rewind", 30)
    try:
        assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 30
        preview = operator_client.post("/api/pipelines/api-rewind/rewind", {"mode": "shift-by", "value": "-12"},
                                       content_type="application/json")
        assert preview.status_code == 200, preview.content
        plan = preview.json()
        assert plan["dry_run"] is True and plan["reprocess"] == 12
        assert plan["partitions"][0]["current"] == 30 and plan["partitions"][0]["new"] == 18
        assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 30

        done = operator_client.post("/api/pipelines/api-rewind/rewind",
                                    {"mode": "to-offset", "value": "18", "dry_run": False, "rollback_sink": True},
                                    content_type="application/json")
        assert done.status_code == 200, done.content
        assert done.json()["partitions"][0]["rows_deleted"] == 12
        assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 18
        outside = operator_client.post("/api/pipelines/api-rewind/rewind", {"mode": "to-offset", "value": "999"},
                                       content_type="application/json")
        assert outside.status_code == 409 and "outside [0, 30]" in outside.json()["error"]
    finally:
        drop_sink(pipeline.sink_table)


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_reconciliation_endpoint_reports_an_exact_pipeline(viewer_client, operator_client, kafka_bootstrap,
                                                               make_topic):
    topic = make_topic("api-reconcile")
    pipeline = consumed_pipeline(kafka_bootstrap, topic, "api-reconcile", 25)
    try:
        fresh = operator_client.post("/api/pipelines/api-reconcile/reconciliation", {"full": True},
                                     content_type="application/json").json()
        report = viewer_client.get("/api/pipelines/api-reconcile/reconciliation").json()
        assert fresh["pipelines"][0]["status"] == report["pipelines"][0]["status"]
        (entry,) = report["pipelines"]
        assert entry["name"] == "api-reconcile"
        assert (entry["lost"], entry["duplicated"], entry["phantom"], entry["lag_records"]) == (0, 0, 0, 0)
        assert entry["partitions"][0]["next_offset"] == 25 and entry["partitions"][0]["high_watermark"] == 25
        listed = viewer_client.get("/api/pipelines/").json()["pipelines"][0]
        assert listed["last_reconciliation"] is not None and listed["status"] == entry["status"]
    finally:
        drop_sink(pipeline.sink_table)


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_an_external_group_is_described_and_reset_with_a_dry_run_first(operator_client, kafka_bootstrap, make_topic):
    from consumers.kafka import admin as kafka_admin
    from tests.views_helpers import produce

    topic = make_topic("api-group")
    produce(kafka_bootstrap, topic, range(40))
    kafka_admin.commit_offsets("billing-etl", topic, {0: 25})
    assert "billing-etl" in [g["group_id"] for g in operator_client.get("/api/groups/").json()["groups"]]
    described = operator_client.get("/api/groups/billing-etl/").json()
    assert [(p["committed"], p["high_watermark"], p["lag_records"]) for p in described["partitions"]] == [(25, 40, 15)]

    preview = operator_client.post("/api/groups/billing-etl/reset",
                                   {"topic": topic, "mode": "to-offset", "value": "10"},
                                   content_type="application/json").json()
    assert preview["dry_run"] is True and preview["partitions"][0]["reprocess"] == 15
    assert kafka_admin.committed_offsets("billing-etl", topic) == {0: 25}
    done = operator_client.post("/api/groups/billing-etl/reset",
                                {"topic": topic, "mode": "to-offset", "value": "10", "execute": True},
                                content_type="application/json")
    assert done.status_code == 200 and done.json()["dry_run"] is False
    assert kafka_admin.committed_offsets("billing-etl", topic) == {0: 10}
    assert ActionLog.objects.filter(group_id="billing-etl", action="reset_group").count() == 2
