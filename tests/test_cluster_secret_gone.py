"""A cluster whose settings are found wrong only when a Kafka client is built (its SASL password file removed or
empty): start, rewind and an operator's watch check refuse up front naming the cluster and the file (409 from the
API, exit 1 from the command), audited, nothing changed, as a trace and a dead-letter replay from Kafka do. They
asked only whether the cluster was configured, so a start was accepted and every run failed, a rewind went on to
Kafka, and a watch check stored an ERR."""
import pytest

from consumers.models import ActionLog, ActionResult, DesiredState, Pipeline, Watch
from tests.commands import run_command
from tests.views_helpers import client_of, make_operator, make_viewer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["removed", "empty"])
def password(request, settings, tmp_path):
    """The cluster payments (SASL), whose password file was removed or emptied. Returns what a refusal says."""
    secret = tmp_path / "payments-password"
    if request.param == "empty":
        secret.write_text("\n")
    configured = tmp_path / "clusters.toml"
    configured.write_text('[clusters.payments]\nbootstrap_servers = "127.0.0.1:9"\n'
                          'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                          f'sasl_username = "tally"\nsasl_password_file = "{secret}"\n')
    settings.TALLY_KAFKA_CLUSTERS = str(configured)
    if request.param == "removed":
        return f"Kafka cluster 'payments': the SASL password cannot be read from file {secret}: No such file"
    return f"Kafka cluster 'payments': the SASL password is read from file {secret}, which is empty"


@pytest.fixture
def orders(password):
    return Pipeline.objects.create(name="orders", topic="orders", sink_table="sink_orders", cluster="payments")


def unchanged(pipeline) -> tuple:
    pipeline = Pipeline.objects.get(pk=pipeline.pk)
    return pipeline.desired_state, pipeline.epoch


def test_a_start_is_a_409_naming_the_cluster_and_its_password_file_and_changes_nothing(orders, password):
    refused = client_of(make_operator()).post("/api/pipelines/orders/actions/start")

    assert refused.status_code == 409
    assert refused.json()["error"].startswith(f"Cannot start pipeline 'orders': {password}")
    assert unchanged(orders) == (DesiredState.STOPPED, 0)
    assert list(ActionLog.objects.values_list("action", "result")) == [("start", ActionResult.REFUSED)]


def test_a_rewind_exits_1_naming_the_cluster_and_its_password_file_and_changes_nothing(orders, password, capsys):
    code, _, err = run_command(capsys, "rewind", "orders", "--to-earliest", "--execute")

    assert code == 1 and f"Cannot rewind pipeline 'orders': {password}" in err
    assert unchanged(orders) == (DesiredState.STOPPED, 0)
    assert list(ActionLog.objects.values_list("action", "result")) == [("rewind", ActionResult.REFUSED)]


def test_a_watch_check_is_refused_naming_the_cluster_and_its_password_file_and_stores_nothing(password, capsys):
    watch = Watch.objects.create(name="team", group_id="team-loader", topic="orders", cluster="payments")
    before = list(Watch.objects.values())

    code, _, err = run_command(capsys, "watch", "check", "team", "--json")
    refused = client_of(make_operator()).post("/api/watches/team/check", {}, content_type="application/json")

    assert code == 1 and f"Cannot check watch 'team': {password}" in err
    assert refused.status_code == 409 and refused.json()["error"].startswith(f"Cannot check watch 'team': {password}")
    assert list(Watch.objects.values()) == before
    assert [(e.action, e.result, e.cluster) for e in ActionLog.objects.order_by("pk")] == [
        ("check_watch", ActionResult.REFUSED, watch.cluster)] * 2


def test_a_topic_check_is_refused_naming_the_cluster_and_its_password_file_and_queues_nothing(orders, password):
    from consumers.models import TopicCheckJob

    refused = client_of(make_operator()).post("/api/pipelines/orders/topic-checks", {}, content_type="application/json")

    assert refused.status_code == 409
    assert refused.json()["error"].startswith(f"Cannot check the topic of pipeline 'orders': {password}")
    assert not TopicCheckJob.objects.exists()
    assert list(ActionLog.objects.values_list("action", "result")) == [("topic_check", ActionResult.REFUSED)]


def test_a_group_reset_is_a_409_naming_the_cluster_and_its_password_file_not_an_outage(password):
    # Waiting does not cure a password file removed: a 503 ("Kafka: ...") told the operator to try again later.
    refused = client_of(make_operator()).post("/api/groups/team-loader/reset?cluster=payments",
                                              {"topic": "orders", "mode": "to-earliest", "execute": True},
                                              content_type="application/json")

    assert refused.status_code == 409
    assert refused.json()["error"].startswith(password)
    assert list(ActionLog.objects.values_list("action", "result")) == [("reset_group", ActionResult.REFUSED)]


def test_the_api_pipeline_detail_says_why_the_cluster_cannot_be_used_and_the_last_error(orders, password):
    # The pipeline page said both; the API's detail had neither, so a pipeline in ERR there had no reason.
    from tests.api_schema import RAW_SCHEMA

    viewer = client_of(make_viewer())
    broken = viewer.get("/api/pipelines/orders/").json()
    Pipeline.objects.filter(pk=orders.pk).update(last_error="run failed: the sink table is gone")
    stopped = viewer.get("/api/pipelines/orders/").json()

    assert broken["cluster_problem"].startswith(password)
    assert broken["last_error"] is None
    assert stopped["last_error"] == "run failed: the sink table is gone"
    detail = RAW_SCHEMA["components"]["schemas"]["PipelineDetail"]
    for name in ("cluster_problem", "last_error"):
        assert detail["properties"][name]["nullable"] is True and name in detail["required"]


PIPELINE_FORM = {"name": "refunds", "topic": "refunds", "cluster": "payments", "sink_table": "sink_refunds",
                 "mode": "exactly-once", "transform": "int_value", "engine": "python",
                 "isolation_level": "read_committed", "on_log_truncated": "stop", "create_table": True}
WATCH_FORM = {"name": "team", "group": "team-loader", "topic": "orders", "cluster": "payments",
              "start_from": "earliest", "settle_seconds": 30}


def problem_of_cluster(password: str) -> str:
    """What a refusal under the cluster field says: the problem, the field naming the cluster already."""
    return password.removeprefix("Kafka cluster 'payments': ")


@pytest.mark.parametrize("path,fields,model", [("/api/pipelines/", PIPELINE_FORM, Pipeline),
                                               ("/api/watches/", WATCH_FORM, Watch)])
def test_creating_on_the_cluster_is_refused_under_the_cluster_field_by_the_api(password, path, fields, model):
    # It was refused under "topic" ("cannot use Kafka to check topic ..."), the field the user had not got wrong.
    refused = client_of(make_operator()).post(path, fields, content_type="application/json")

    assert refused.status_code == 400
    errors = refused.json()["errors"]
    assert list(errors) == ["cluster"] and errors["cluster"][0]["message"].startswith(problem_of_cluster(password))
    assert not model.objects.exists()
    assert ActionLog.objects.get().result == ActionResult.REFUSED


@pytest.mark.parametrize("path,fields,model", [("/pipelines/new/", PIPELINE_FORM, Pipeline),
                                               ("/watches/new/", WATCH_FORM, Watch)])
def test_creating_on_the_cluster_is_refused_beside_the_cluster_field_by_the_form(password, path, fields, model):
    refused = client_of(make_operator()).post(path, fields)

    assert refused.status_code == 400
    errors = refused.context["form"].errors
    assert list(errors) == ["cluster"] and errors["cluster"][0].startswith(problem_of_cluster(password))
    assert not model.objects.exists()
    assert ActionLog.objects.get().result == ActionResult.REFUSED


def test_the_group_page_says_in_a_sentence_what_it_could_not_read_and_why_with_the_detail_beside(password):
    # It showed "describe_group: ClusterConfigError: ...; group_committed_offsets: ClusterConfigError: ...".
    from html import unescape

    page = client_of(make_viewer()).get("/groups/team-loader/?cluster=payments")

    assert page.status_code == 200
    text = unescape(page.content.decode())
    sentence = (f"Tally could not read the group's state and members and its committed offsets from Kafka: "
                f"{password}")
    assert page.context["error"].startswith(sentence)
    assert "ClusterConfigError" not in page.context["error"] and "describe_group" not in page.context["error"]
    assert sentence in text
    assert page.context["error_detail"].startswith("describe_group: ClusterConfigError: ")   # kept, smaller
    assert 'id="group-error-detail"' in text
