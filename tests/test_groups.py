"""Consumer groups that Tally does not run, read from the real embedded broker."""
import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, LagSnapshot, Pipeline
from consumers.operations import groups
from consumers.reconciliation import snapshots
from tests.producing import numbered, send
from tests.views_helpers import client_of, make_operator

pytestmark = pytest.mark.kafka


@pytest.fixture
def operator(db):
    """A test client signed in as an operator."""
    return client_of(make_operator())


@pytest.fixture
def member(kafka_bootstrap):
    """join(topic, group, {partition: offset}) -> a live group member that committed those offsets."""
    consumers = []

    def join(topic, group_id, offsets):
        consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group_id,
                                 session_timeout_ms=6000, heartbeat_interval_ms=1000, enable_auto_commit=False,
                                 auto_offset_reset="earliest")
        consumers.append(consumer)
        deadline = time.monotonic() + 20
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
        return consumer

    yield join
    for consumer in consumers:
        consumer.close()


def test_an_external_group_is_described_with_state_members_and_lag_per_partition(kafka_bootstrap, make_topic,
                                                                                   member, db):
    topic = make_topic("grp", partitions=2)
    send(topic, numbered(60, partitions=2))
    member(topic, "g-external", {0: 10, 1: 30})
    report = groups.describe("g-external")
    assert report.state == "Stable" and len(report.members) == 1 and report.pipeline is None
    rows = {p.partition: (p.committed, p.high_watermark, p.lag_records) for p in report.partitions}
    assert rows == {0: (10, 30, 20), 1: (30, 30, 0)}
    assert report.lag_records == 20 and report.lag_seconds > 0 and report.errors == []
    assert report.as_json()["partitions"][0]["topic"] == topic


def test_pipeline_groups_are_left_out_of_the_external_list_and_sampled_groups_get_a_snapshot(
        kafka_bootstrap, make_topic, member, db):
    topic = make_topic("grp-own")
    send(topic, numbered(10))
    Pipeline.objects.create(name="own", topic=topic, group_id="g-own", sink_table="own_sink")
    member(topic, "g-own", {0: 4})
    member(topic, "g-other", {0: 6})
    external = groups.list_groups()
    assert "g-other" in external and "g-own" not in external
    assert "g-own" in groups.list_groups(include_pipelines=True)
    snapshots.take_snapshots()
    sample = LagSnapshot.objects.get(group_id="g-other", pipeline__isnull=True)
    assert (sample.lag_records, sample.position, sample.high_watermark) == (4, 6, 10)


def test_describing_an_unknown_group_exits_1_and_a_known_one_prints_json(kafka_bootstrap, make_topic, member, db):
    with pytest.raises(CommandError, match="no consumer group 'nosuch'") as refused:
        call_command("groups", "describe", "nosuch")
    assert refused.value.returncode == 1
    topic = make_topic("grp-cli")
    send(topic, numbered(5))
    member(topic, "g-cli", {0: 3})
    out = StringIO()
    call_command("groups", "describe", "g-cli", "--json", stdout=out)
    assert json.loads(out.getvalue())["lag_records"] == 2


def test_a_group_kafka_does_not_know_is_not_found_and_a_reset_of_it_is_refused_and_creates_nothing(
        kafka_bootstrap, make_topic, operator):
    topic = make_topic("grp-unknown")
    send(topic, numbered(6))

    page = operator.get("/groups/nosuch/")
    body = page.content.decode()
    assert page.status_code == 404
    assert "Kafka cluster &#x27;default&#x27; has no consumer group &#x27;nosuch&#x27;" in body
    assert "Reset offsets" not in body and "group_reset" not in body and "/groups/nosuch/reset/" not in body
    api = operator.get("/api/groups/nosuch/")
    assert api.status_code == 404 and "has no consumer group 'nosuch'" in api.json()["error"]

    # Every door refuses a reset of it, dry run or not, and says why; each refusal is audited.
    for step in ("preview", "execute"):
        refused = operator.post("/groups/nosuch/reset/", {"topic": topic, "mode": "to-earliest", "step": step})
        assert refused.status_code == 404 and "has no consumer group" in refused.content.decode()
    for execute in (False, True):
        refused = operator.post("/api/groups/nosuch/reset", {"topic": topic, "mode": "to-earliest", "execute": execute},
                                content_type="application/json")
        assert refused.status_code == 404 and "has no consumer group 'nosuch'" in refused.json()["error"]
        assert refused.json()["action_id"] is not None
    with pytest.raises(CommandError, match="has no consumer group 'nosuch'") as cli:
        call_command("groups", "reset", "nosuch", "--topic", topic, "--to-earliest", "--execute")
    assert cli.value.returncode == 1
    entries = ActionLog.objects.filter(group_id="nosuch")
    assert [(e.action, e.result) for e in entries] == [("reset_group", "refused")] * 5
    assert "nosuch" not in kafka_admin.list_groups() and kafka_admin.group_committed_offsets("nosuch") == {}
    assert operator.get("/api/groups/nosuch/").status_code == 404

    # A group with committed offsets and no members is Empty, and known: shown, and reset.
    kafka_admin.commit_offsets("g-empty", topic, {0: 2})
    shown = operator.get("/groups/g-empty/")
    assert shown.status_code == 200 and "Reset offsets" in shown.content.decode()
    assert operator.get("/api/groups/g-empty/").json()["members"] == []
    done = operator.post("/api/groups/g-empty/reset", {"topic": topic, "mode": "to-latest", "execute": True},
                         content_type="application/json")
    assert done.status_code == 200, json.dumps(done.json())
    assert kafka_admin.committed_offsets("g-empty", topic) == {0: 6}


def test_a_reset_confirmed_from_the_group_page_by_htmx_loads_the_group_page_instead_of_nesting_it_in_the_panel(
        kafka_bootstrap, make_topic, operator):
    topic = make_topic("grp-htmx")
    send(topic, numbered(10))
    kafka_admin.commit_offsets("g-htmx", topic, {0: 3})
    reset = {"topic": topic, "mode": "to-latest", "value": "", "partitions": ""}

    preview = operator.post("/groups/g-htmx/reset/", {**reset, "step": "preview"}, HTTP_HX_REQUEST="true")
    assert preview.status_code == 200 and 'id="confirm-reset"' in preview.content.decode()
    done = operator.post("/groups/g-htmx/reset/", {**reset, "step": "execute"}, HTTP_HX_REQUEST="true")

    # htmx would follow a 302 inside the request and swap the whole group page into #rewind-panel
    assert done.status_code == 200 and done.headers["HX-Redirect"] == "/groups/g-htmx/"
    assert kafka_admin.committed_offsets("g-htmx", topic) == {0: 10}
    page = operator.get("/groups/g-htmx/").content.decode()
    assert "Offsets of group g-htmx reset: to-latest" in page
    # without htmx the form still redirects
    plain = operator.post("/groups/g-htmx/reset/", {**reset, "step": "execute"})
    assert plain.status_code == 302 and plain.headers["Location"] == "/groups/g-htmx/"


def test_a_groups_page_keeps_its_resets_however_many_other_actions_came_after(kafka_bootstrap, make_topic, operator):
    topic = make_topic("grp-log")
    send(topic, numbered(10))
    kafka_admin.commit_offsets("g-log", topic, {0: 3})
    done = operator.post("/groups/g-log/reset/", {"topic": topic, "mode": "to-earliest", "step": "execute"})
    assert done.status_code == 302
    entry = ActionLog.objects.get(group_id="g-log", dry_run=False)
    ActionLog.objects.bulk_create([ActionLog(action="start", actor="cli", result="done") for _ in range(250)])
    assert f'id="action-{entry.pk}"' in operator.get("/groups/g-log/").content.decode()


def test_an_open_transaction_is_not_lag_of_an_external_group(kafka_bootstrap, make_topic, db):
    # As reconciliation and watches measure: a read_committed consumer cannot pass an open transaction.
    topic = make_topic("grp-tx")
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{topic}", acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    for value in range(5):
        producer.send(topic, str(value).encode(), partition=0)
    producer.commit_transaction()
    read_all = kafka_admin.watermarks(topic)[0].high   # 5 records and their commit marker
    kafka_admin.commit_offsets("g-tx", topic, {0: read_all})
    producer.begin_transaction()
    for value in range(100, 104):
        producer.send(topic, str(value).encode(), partition=0)
    producer.flush()
    try:
        mark = kafka_admin.watermarks(topic)[0]
        assert mark.high > mark.end == read_all
        report = groups.describe("g-tx")
        assert (report.lag_records, report.partitions[0].high_watermark) == (0, mark.high)
    finally:
        producer.abort_transaction()
        producer.close(timeout=5)


def test_a_group_whose_id_ends_with_reset_or_holds_url_characters_has_its_page_and_its_reset(
        kafka_bootstrap, make_topic, operator):
    topic = make_topic("grp-url")
    send(topic, numbered(10))
    for group in ("etl/reset", "a b%?#/reset", "a b%?#"):
        kafka_admin.commit_offsets(group, topic, {0: 3})
        page = operator.get(reverse("group", kwargs={"group_id": group}))
        # /groups/etl/reset/ was routed to the reset of group "etl", which answers only POST: 405
        assert page.status_code == 200, (group, page.status_code)
        assert f'action="{reverse("group_reset", kwargs={"group_id": group})}"' in page.content.decode()
        api = operator.get(reverse("api:group", kwargs={"group_id": group}))
        assert api.status_code == 200 and api.json()["group_id"] == group

    # The reset form of each reaches its own group. (The embedded broker drops an offset fetch of an id with
    # "/", so the one with a "/" that is reset here is unknown to Kafka: refused, and audited under its id.)
    reset = {"topic": topic, "mode": "to-latest", "value": "", "partitions": "", "step": "execute"}
    refused = operator.post(reverse("group_reset", kwargs={"group_id": "nosuch/reset"}), reset)
    assert refused.status_code == 404 and "no consumer group &#x27;nosuch/reset&#x27;" in refused.content.decode()
    assert ActionLog.objects.get().group_id == "nosuch/reset"
    done = operator.post(reverse("group_reset", kwargs={"group_id": "a b%?#"}), reset)
    assert done.status_code == 302 and done.headers["Location"] == reverse("group", kwargs={"group_id": "a b%?#"})
    assert kafka_admin.committed_offsets("a b%?#", topic) == {0: 10}


def test_the_reset_address_read_with_get_leads_to_the_groups_reset_form_not_to_a_group_named_team_reset(
        kafka_bootstrap, make_topic, operator):
    # GET /groups/team/reset/ showed the page of a group "team/reset" (which Kafka does not know): a 404 titled
    # "Group team/reset". A group of that name is still shown there (the test above).
    topic = make_topic("grp-reset-get")
    send(topic, numbered(4))
    kafka_admin.commit_offsets("team", topic, {0: 2})

    answer = operator.get("/groups/team/reset/")

    assert answer.status_code == 302 and answer.headers["Location"] == "/groups/team/#rewind-panel"
    page = operator.get(answer.headers["Location"])
    assert page.status_code == 200 and page.context["group_id"] == "team"
    assert 'id="rewind-panel"' in page.content.decode()
    assert not ActionLog.objects.exists()   # a GET changes nothing
