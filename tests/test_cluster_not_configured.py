"""A watch or a pipeline whose Kafka cluster is no longer configured (the clusters file dropped it): a check asked
for by an operator is refused up front naming the cluster (409 from the API, exit 1 from the command), audited, the
watch's stored state unchanged, as start, rewind and a replay from Kafka are; the periodic pass keeps recording the
problem on the watch (monitoring). A trace, a read, is refused naming the cluster too (409, exit 1, on the pages),
not reported as Kafka being down (503), and not audited."""
import html
import json

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult, Pipeline, Status, Watch, WatchPartition, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit
from tests.api_schema import assert_documented, operation
from tests.commands import run_command
from tests.views_helpers import client_of, make_operator, make_viewer
from tests.watch_helpers import produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

GONE = "Kafka cluster 'payments': no such cluster (configured: default;"


@pytest.fixture
def payments(transactional_db, kafka_bootstrap, settings, tmp_path):
    """A clusters file naming the cluster payments (the test broker). Returns a function that drops payments from
    the file, as an operator editing it would."""
    configured = tmp_path / "clusters.toml"
    configured.write_text(f'[clusters.payments]\nbootstrap_servers = "{kafka_bootstrap}"\n')
    settings.TALLY_KAFKA_CLUSTERS = str(configured)

    def drop():
        without = tmp_path / "clusters-without-payments.toml"
        without.write_text("")
        settings.TALLY_KAFKA_CLUSTERS = str(without)
    return drop


@pytest.fixture
def team_watch(payments, make_topic, table_name):
    """The watch team on payments: a topic of 5 records, a group that committed them all, a table with their rows."""
    topic = make_topic("pay")
    produce(topic, [(None, str(v).encode()) for v in range(1, 6)])
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE TABLE {} AS SELECT v::bigint AS id FROM generate_series(1, 5) v").format(
            sql.Identifier(table_name)).as_string(cursor.cursor))
    kafka_admin.commit_offsets("team-loader", topic, {0: 5}, cluster="payments")
    spec = watch_setup.WatchSpec(name="team", group="team-loader", topic=topic, cluster="payments",
                                 sink_table=table_name, record_id="value", row_id="id", settle_seconds=0)
    return watch_setup.create(spec)[0]


def stored_state(watch: Watch) -> tuple:
    return (list(Watch.objects.filter(pk=watch.pk).values()),
            list(WatchPartition.objects.filter(watch=watch).order_by("partition").values()),
            list(WatchRange.objects.filter(watch=watch).order_by("pk").values_list("pk", "end", "lost")))


def test_a_check_of_a_watch_whose_cluster_is_gone_is_refused_naming_it_and_the_pass_still_records_it(
        team_watch, payments, capsys):
    """It answered 200 with status ERR and "Kafka: ClusterConfigError: …", stored on the watch, as if Kafka had been
    asked: an operator's check is refused up front instead, audited, the watch as it was."""
    client = client_of(make_operator())
    checked = client.post("/api/watches/team/check", {}, content_type="application/json")
    assert checked.status_code == 200 and (checked.json()["status"], checked.json()["checked"]) == ("OK", 5)
    payments()
    before = stored_state(team_watch)

    refused = client.post("/api/watches/team/check", {}, content_type="application/json")
    assert_documented(operation("post", "/api/watches/{name}/check"), refused, "post", "/api/watches/team/check")
    assert refused.status_code == 409
    assert refused.json()["error"].startswith(f"Cannot check watch 'team': {GONE}")
    code, _, err = run_command(capsys, "watch", "check", "team", "--json")
    assert code == 1 and f"Refused: Cannot check watch 'team': {GONE}" in err
    entries = list(ActionLog.objects.filter(action="check_watch").order_by("pk"))
    assert [(e.result, e.cluster, e.params["watch"]) for e in entries] == [
        (ActionResult.REFUSED, "payments", "team")] * 2
    assert refused.json() == {"error": entries[0].message, "action_id": entries[0].pk}
    assert stored_state(team_watch) == before

    # The periodic pass is monitoring: it records the problem on the watch, as it did, and audits nothing.
    [report] = watch_audit.check_all()
    assert report.status == Status.ERR and GONE in report.error
    team_watch.refresh_from_db()
    assert team_watch.status == Status.ERR and GONE in team_watch.last_error
    assert ActionLog.objects.filter(action="check_watch").count() == 2


def test_a_check_of_a_watch_on_a_configured_cluster_is_not_refused(team_watch, capsys):
    code, out, _ = run_command(capsys, "watch", "check", "team", "--json")
    assert code == 0 and json.loads(out)["checked"] == 5
    assert not ActionLog.objects.filter(action="check_watch").exists()


# A trace reads Kafka and changes nothing: refused naming the cluster, a 409 as for any action on it (not the 503 of
# a Kafka that is down: waiting would not help), and not audited, as no read's refusal of its query is.

def trace_refused(client, payments, kind, name, query):
    """A trace of the pipeline or watch `name` answers until payments is dropped, then the API and the page refuse it
    (409) naming the cluster, unaudited. Returns the API's answer."""
    kinds = {"pipeline": "pipelines", "watch": "watches"}[kind]
    path = f"/api/{kinds}/{name}/trace?{query}"
    assert client.get(path).status_code == 200
    payments()
    answer = client.get(path)
    assert_documented(operation("get", f"/api/{kinds}/{{name}}/trace"), answer, "get", path)
    assert answer.status_code == 409
    assert answer.json()["error"].startswith(f"Cannot trace a record of {kind} '{name}': {GONE}")
    page = client.get(f"/{kinds}/{name}/trace/?{query}", HTTP_HX_REQUEST="true")
    assert page.status_code == 409
    assert f"Cannot trace a record of {kind} '{name}': {GONE}" in html.unescape(page.content.decode())
    assert not ActionLog.objects.exclude(action="create_watch").exists()   # a read: not audited
    return answer


@pytest.fixture
def orders(team_watch):
    """The pipeline orders on payments, reading the watch's topic."""
    return Pipeline.objects.create(name="orders", topic=team_watch.topic, sink_table="sink_orders", cluster="payments")


@pytest.mark.parametrize("query", ["partition=0&offset=2", "key=k7"])
def test_a_trace_of_a_pipeline_whose_cluster_is_gone_is_a_409_naming_it(orders, payments, query):
    answer = trace_refused(client_of(make_viewer()), payments, "pipeline", "orders", query)
    assert answer.json()["field"] is None


def test_the_trace_command_of_a_pipeline_whose_cluster_is_gone_exits_1_naming_it(orders, payments, capsys):
    payments()
    code, _, err = run_command(capsys, "trace", "orders", "--partition", "0", "--offset", "2")
    assert code == 1 and f"Refused: Cannot trace a record of pipeline 'orders': {GONE}" in err


def test_a_trace_of_a_watch_whose_cluster_is_gone_is_a_409_naming_it(team_watch, payments):
    trace_refused(client_of(make_operator()), payments, "watch", "team", "partition=0&offset=2")
