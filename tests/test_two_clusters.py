"""Two Kafka clusters at once: two brokers, a topic of one name on each with different records, a pipeline on
each, and a group of one name on each: the groups page, its API, the snapshots and the metrics keep them apart;
the dashboard's forms add a pipeline and a watch on the cluster the operator picks."""
import uuid

import pytest
from django.test import Client
from kafka.admin import NewTopic
from prometheus_client.parser import text_string_to_metric_families

from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka import broker, clusters
from consumers.models import ActionLog, ActionResult, Pipeline, Watch
from consumers.reconciliation.reconcile import reconcile_pipeline
from consumers.reconciliation.snapshots import take_snapshots
from tests.admin_support import staff_operator
from tests.chaos import sink_counts
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.views_helpers import make_operator, make_viewer

pytestmark = [pytest.mark.kafka]


@pytest.fixture(scope="module")
def second_broker():
    port = broker.free_port()
    process = broker.start_broker(port)
    yield f"127.0.0.1:{port}"
    clusters.close_shared_admins()   # before the broker goes: they would keep reconnecting to it
    broker.stop_broker(process)


@pytest.fixture
def two_clusters(transactional_db, kafka_bootstrap, second_broker, settings, tmp_path):
    path = tmp_path / "clusters.toml"
    path.write_text(f'[clusters.second]\nbootstrap_servers = "{second_broker}"\n')
    settings.TALLY_KAFKA_CLUSTERS = str(path)
    tables = []
    yield tables
    drop_sink_tables(tables)


def fill(cluster: str, topic: str, values) -> None:
    with kafka_admin.admin_session(cluster) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    producer = clusters.producer(cluster, acks="all")
    for value in values:
        producer.send(topic, str(value).encode(), partition=value % 2)
    producer.flush(timeout=30)
    producer.close(timeout=5)


def metric_samples(body: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def test_a_pipeline_on_each_of_two_clusters_reads_its_own_topic_and_groups_stay_apart(two_clusters):
    topic = f"orders-{uuid.uuid4().hex[:8]}"   # one name, on both clusters
    fill("default", topic, range(1, 11))
    fill("second", topic, range(101, 131))
    pipelines = {}
    for cluster in ("default", "second"):
        name = f"{topic}-{cluster}"
        pipelines[cluster] = create_pipeline(name, topic, f"sink_{name}".replace("-", "_"), cluster=cluster)
        two_clusters.append(pipelines[cluster].sink_table)
        result = run_pipeline(name, stop_when_caught_up=True, max_seconds=60)
        assert result.reason == "caught_up", result.detail
    assert sink_counts(pipelines["default"].sink_table) == {v: 1 for v in range(1, 11)}
    assert sink_counts(pipelines["second"].sink_table) == {v: 1 for v in range(101, 131)}
    for cluster, pipeline in pipelines.items():
        report = reconcile_pipeline(pipeline)
        assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK"), cluster

    # A group of one name on each cluster, at different positions.
    group = f"billing-{uuid.uuid4().hex[:6]}"
    kafka_admin.commit_offsets(group, topic, {0: 5, 1: 5}, cluster="default")     # 10 records: lag 0
    kafka_admin.commit_offsets(group, topic, {0: 5, 1: 5}, cluster="second")      # 30 records: lag 20
    take_snapshots()

    client = Client()
    client.force_login(make_viewer())
    listed = client.get("/api/groups/").json()
    assert {(g["cluster"], g["pipeline"]) for g in listed["groups"] if g["group_id"] == group} == {
        ("default", None), ("second", None)}
    assert {"cluster": "second", "group_id": pipelines["second"].group_id,
            "pipeline": pipelines["second"].name} in listed["groups"]
    page = client.get("/groups/").content.decode()
    assert f'href="/groups/{group}/?cluster=second"' in page and f'href="/groups/{group}/"' in page
    detail = client.get(f"/api/groups/{group}/?cluster=second").json()
    assert detail["cluster"] == "second" and detail["lag_records"] == 20
    assert client.get(f"/api/groups/{group}/").json()["lag_records"] == 0
    assert client.get(f"/api/groups/{group}/?cluster=nowhere").status_code == 400

    found = metric_samples(client.get("/metrics").content.decode())
    assert found[("tally_group_lag_records", (("cluster", "second"), ("group", group)))] == 20
    assert found[("tally_group_lag_records", (("cluster", "default"), ("group", group)))] == 0
    for cluster, pipeline in pipelines.items():
        labels = (("cluster", cluster), ("delivery_mode", "exactly_once"), ("pipeline", pipeline.name),
                  ("topic", topic))
        assert found[("tally_pipeline_lag_records", labels)] == 0

    clusters_page = client.get("/api/clusters/").json()["clusters"]
    assert [(c["name"], c["reachable"], c["pipelines"]) for c in clusters_page] == [
        ("default", True, [pipelines["default"].name]), ("second", True, [pipelines["second"].name])]

    # A reset of the group on the second cluster: the action log names that cluster and links there.
    operator = Client()
    operator.force_login(make_operator())
    reset = operator.post(f"/api/groups/{group}/reset?cluster=second",
                          {"topic": topic, "mode": "to-earliest", "execute": True}, content_type="application/json")
    assert reset.status_code == 200, reset.content
    assert kafka_admin.committed_offsets(group, topic, cluster="second") == {0: 0, 1: 0}
    assert kafka_admin.committed_offsets(group, topic, cluster="default") == {0: 5, 1: 5}
    logged = [entry for entry in client.get("/api/action-log").json()["actions"] if entry["group"] == group]
    assert [(entry["action"], entry["cluster"]) for entry in logged] == [("reset_group", "second")]
    page = client.get("/action-log/").content.decode()
    assert f'href="/groups/{group}/?cluster=second">{group}</a> <span class="tag" title="Kafka cluster">second' in page
    run_logged = client.get(f"/api/pipelines/{pipelines['second'].name}/").json()
    assert run_logged["cluster"] == "second"


def test_an_operator_picks_the_cluster_in_the_pipeline_and_watch_forms(two_clusters):
    topic = f"only-second-{uuid.uuid4().hex[:8]}"   # a topic the default cluster does not have
    fill("second", topic, range(1, 5))
    table = f"sink_{topic}".replace("-", "_")
    two_clusters.append(table)
    operator = Client()
    operator.force_login(make_operator())
    for page in ("/pipelines/new/", "/watches/new/"):
        html = operator.get(page).content.decode()
        assert '<option value="default" selected>default</option>' in html and '<option value="second">' in html

    pipeline = {"name": "second-orders", "topic": topic, "sink_table": table, "mode": "exactly-once",
                "transform": "int_value", "engine": "python", "isolation_level": "read_committed",
                "on_log_truncated": "stop", "create_table": "on"}
    refused = operator.post("/pipelines/new/", pipeline)   # on the default cluster the topic does not exist
    assert refused.status_code == 400 and "does not exist in Kafka" in refused.content.decode()
    unknown = operator.post("/pipelines/new/", {**pipeline, "cluster": "nowhere"})
    assert unknown.status_code == 400 and "no such cluster" in unknown.content.decode()
    created = operator.post("/pipelines/new/", {**pipeline, "cluster": "second"})
    assert created["Location"] == "/pipelines/second-orders/"
    assert Pipeline.objects.get(name="second-orders").cluster == "second"

    group = f"team-{uuid.uuid4().hex[:6]}"
    kafka_admin.commit_offsets(group, topic, {0: 1, 1: 1}, cluster="second")
    watch = {"name": "second-team", "group": group, "topic": topic, "start_from": "earliest", "settle_seconds": "0"}
    assert operator.post("/watches/new/", watch).status_code == 400
    assert operator.post("/watches/new/", {**watch, "cluster": "second"})["Location"] == "/watches/second-team/"
    assert Watch.objects.get(name="second-team").cluster == "second"


def test_a_cluster_moved_in_the_file_is_read_from_its_new_brokers_and_its_old_admin_client_is_closed(
        two_clusters, kafka_bootstrap, settings):
    """The web app and the workers read the clusters file again when it changes, without a restart. The process's
    shared admin client of the cluster's old settings was kept open for ever, its IO thread reconnecting to brokers
    the cluster no longer names (with the old credentials); the next call on the new settings closes it."""
    topic = f"only-second-{uuid.uuid4().hex[:8]}"   # a topic the default cluster's broker does not have
    fill("second", topic, range(1, 3))
    assert topic in kafka_admin.shared_read("second", lambda client: client.list_topics())
    with clusters.shared_admin("second") as old_client:
        pass
    path = settings.TALLY_KAFKA_CLUSTERS
    with open(path, "w") as moved:   # a comment too: the file's size changes, whatever its time stamp's grain
        moved.write(f'# moved\n[clusters.second]\nbootstrap_servers = "{kafka_bootstrap}"\n')
    assert topic not in kafka_admin.shared_read("second", lambda client: client.list_topics())
    assert old_client._closed


def test_a_cluster_removed_from_the_file_has_its_admin_client_closed_at_the_next_read_of_the_file(
        two_clusters, settings):
    """Nothing asks for a removed cluster again, so closing at the cluster's next call (as for a changed one) left
    its client open, reconnecting for the life of the process; it is closed when the file without it is read."""
    with clusters.shared_admin("second") as old_client:
        pass
    with open(settings.TALLY_KAFKA_CLUSTERS, "w") as removed:
        removed.write("# second removed\n")

    assert clusters.names() == [clusters.DEFAULT]
    assert old_client._closed


def test_a_cluster_removed_while_its_admin_client_is_in_use_has_it_closed_once_the_call_ends(two_clusters, settings):
    with clusters.shared_admin("second") as client:
        with open(settings.TALLY_KAFKA_CLUSTERS, "w") as removed:
            removed.write("# second removed\n")
        assert clusters.names() == [clusters.DEFAULT]
        assert not client._closed   # the call in progress goes on
    assert client._closed


@pytest.fixture
def group_on_second(two_clusters):
    """A team's group on the second cluster only, at offset 5 of a one-partition topic of 10 records."""
    topic, group = f"s-{uuid.uuid4().hex[:8]}", f"team-{uuid.uuid4().hex[:6]}"
    with kafka_admin.admin_session("second") as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    producer = clusters.producer("second", acks="all")
    for value in range(10):
        producer.send(topic, str(value).encode(), partition=0)
    producer.flush(timeout=30)
    producer.close(timeout=5)
    kafka_admin.commit_offsets(group, topic, {0: 5}, cluster="second")
    return topic, group


def client_of_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("door", ["viewer page", "viewer API", "bad input page", "bad input API"])
def test_a_refused_reset_on_the_second_cluster_is_logged_on_that_clusters_group(group_on_second, door):
    topic, group = group_on_second
    if door == "viewer page":
        answer = client_of_user(make_viewer()).post(f"/groups/{group}/reset/?cluster=second",
                                                    {"topic": topic, "mode": "to-earliest", "step": "execute"})
        assert answer.status_code == 403
    elif door == "viewer API":
        answer = client_of_user(make_viewer()).post(f"/api/groups/{group}/reset?cluster=second",
                                                    {"topic": topic, "mode": "to-earliest"},
                                                    content_type="application/json")
        assert answer.status_code == 403
    elif door == "bad input page":
        answer = client_of_user(make_operator()).post(f"/groups/{group}/reset/?cluster=second",
                                                      {"topic": topic, "mode": "to-offset", "value": "x",
                                                       "step": "preview"})
        assert answer.status_code == 422
    else:
        answer = client_of_user(make_operator()).post(f"/api/groups/{group}/reset?cluster=second",
                                                      {"topic": topic, "mode": "to-offset", "value": "x"},
                                                      content_type="application/json")
        assert answer.status_code == 400
    entry = ActionLog.objects.get(group_id=group)
    assert (entry.result, entry.cluster) == (ActionResult.REFUSED, "second")
    assert kafka_admin.committed_offsets(group, topic, [0], cluster="second") == {0: 5}
    viewer = client_of_user(make_viewer("v2"))
    assert f'id="action-{entry.pk}"' in viewer.get(f"/groups/{group}/?cluster=second").content.decode()
    assert viewer.get(f"/api/action-log?group={group}").json()["actions"][0]["cluster"] == "second"


@pytest.mark.parametrize("door", ["page", "API"])
def test_a_reset_naming_a_cluster_not_configured_is_refused_and_audited(group_on_second, door):
    topic, group = group_on_second
    operator = client_of_user(make_operator())
    if door == "page":
        answer = operator.post(f"/groups/{group}/reset/?cluster=nowhere",
                               {"topic": topic, "mode": "to-earliest", "step": "execute"})
        assert answer.status_code == 404
    else:
        answer = operator.post(f"/api/groups/{group}/reset?cluster=nowhere",
                               {"topic": topic, "mode": "to-earliest", "execute": True},
                               content_type="application/json")
        assert answer.status_code == 400 and "cluster" in answer.json()["errors"]
    entry = ActionLog.objects.get(group_id=group)
    assert (entry.action, entry.result, entry.params["cluster"]) == ("reset_group", ActionResult.REFUSED, "nowhere")
    assert kafka_admin.committed_offsets(group, topic, [0], cluster="second") == {0: 5}


def test_the_admin_lists_and_resets_a_group_of_the_second_cluster(group_on_second):
    topic, group = group_on_second
    admin = client_of_user(staff_operator())
    default_list = admin.get("/admin/consumers/groups/").content.decode()
    assert group not in default_list and 'href="/admin/consumers/groups/?cluster=second"' in default_list
    second_list = admin.get("/admin/consumers/groups/?cluster=second").content.decode()
    assert f'value="{group}"' in second_list and f'href="/groups/{group}/?cluster=second"' in second_list
    assert admin.get("/admin/consumers/groups/?cluster=nowhere").status_code == 404

    form = {"group": group, "cluster": "second", "topic": topic, "mode": "to-earliest", "value": "", "partitions": ""}
    preview = admin.post("/admin/consumers/groups/reset/", {**form, "step": "preview"}).content.decode()
    assert 'id="execute-reset"' in preview and "5 → <b>0</b>" in preview
    assert kafka_admin.committed_offsets(group, topic, [0], cluster="second") == {0: 5}
    done = admin.post("/admin/consumers/groups/reset/", {**form, "step": "execute"})
    assert done.status_code == 302 and done["Location"] == "/admin/consumers/groups/?cluster=second"
    assert kafka_admin.committed_offsets(group, topic, [0], cluster="second") == {0: 0}
    assert list(ActionLog.objects.filter(group_id=group).order_by("pk").values_list("dry_run", "params__cluster")) == [
        (True, "second"), (False, "second")]


def test_the_admin_lists_the_default_clusters_groups_when_the_clusters_file_is_broken(
        transactional_db, settings, tmp_path, monkeypatch):
    from consumers.operations import groups as kafka_groups

    monkeypatch.setattr(kafka_groups, "list_groups", lambda cluster=None, **kwargs: ["team-a"] if cluster == "default"
                        else [])
    path = tmp_path / "clusters.toml"
    path.write_text("[clusters.second\nbootstrap_servers = 1\n")   # not TOML
    settings.TALLY_KAFKA_CLUSTERS = str(path)
    answer = client_of_user(staff_operator()).get("/admin/consumers/groups/")
    assert answer.status_code == 200 and 'value="team-a"' in answer.content.decode()
