"""The admin's rewind and group reset against the real broker and engine: several pipelines previewed
per partition, executed with one confirmation, partial success reported per pipeline, positions and sinks
checked row by row, and the exactly-once sink exact again after the pipelines catch up."""
import re
import uuid

import pytest

from consumers.kafka import admin as kafka_admin
from consumers.models import ActionLog, ActionResult, PartitionOffset
from tests.admin_support import messages_of, post_action, staff_operator
from tests.views_helpers import client_of, consumed_pipeline, drop_sink, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

PIPELINES = "/admin/consumers/pipeline/"


def sink_offsets(table):
    from django.db import connection
    from psycopg2 import sql

    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT source_offset, id FROM {} ORDER BY source_offset").format(sql.Identifier(table)))
        return cursor.fetchall()


def position(pipeline):
    return PartitionOffset.objects.get(pipeline=pipeline, partition=0).next_offset


def test_an_operator_rewinds_three_pipelines_with_one_preview_and_one_confirmation(kafka_bootstrap, make_topic):
    from consumers.engine.python import run_pipeline

    orders = consumed_pipeline(kafka_bootstrap, make_topic("adm-orders"), "adm-orders", 20)
    payments = consumed_pipeline(kafka_bootstrap, make_topic("adm-payments"), "adm-payments", 20)
    refunds = consumed_pipeline(kafka_bootstrap, make_topic("adm-refunds"), "adm-refunds", 3)
    selected = [orders.pk, payments.pk, refunds.pk]
    try:
        client = client_of(staff_operator())
        rewind = {"mode": "shift-by", "value": "-5", "partitions": "", "rollback_sink": "on"}

        preview = post_action(client, PIPELINES, "rewind", selected, step="preview", **rewind)

        page = preview.content.decode()
        assert preview.status_code == 200 and "nothing has changed yet" in page
        for name in ("adm-orders", "adm-payments"):
            row = preview.context["previews"][[p["pipeline"].name for p in preview.context["previews"]].index(name)]
            assert [(m["current"], m["new"], m["reprocess"], m["skip"], m["rows_to_delete"])
                    for m in row["preview"]["partitions"]] == [(20, 15, 5, 0, 5)]
            assert f'id="preview-table-{name}"' in page
        assert "Refused: shift-by -5 refused: partition 0: offset -2 is outside [0, 3]" in page
        assert "Execute: rewind 2 pipelines" in page
        assert (position(orders), position(payments), position(refunds)) == (20, 20, 3)   # a preview moves nothing

        done = post_action(client, PIPELINES, "rewind", selected, step="execute", **rewind)

        shown = messages_of(done)
        assert any(m.startswith("Pipeline adm-orders: rewind done: shift-by -5: p0 20->15") for m in shown), shown
        assert any(m.startswith("Pipeline adm-payments: rewind done: shift-by -5: p0 20->15") for m in shown), shown
        assert any(m.startswith("Pipeline adm-refunds: rewind refused: shift-by -5 refused") for m in shown), shown
        assert (position(orders), position(payments), position(refunds)) == (15, 15, 3)
        assert sink_offsets(orders.sink_table) == [(o, o + 1) for o in range(15)]      # rows 15..19 rolled back
        assert sink_offsets(refunds.sink_table) == [(o, o + 1) for o in range(3)]
        real = ActionLog.objects.filter(action="rewind", actor="otto", dry_run=False)
        assert sorted(real.values_list("pipeline__name", "result")) == [
            ("adm-orders", ActionResult.DONE), ("adm-payments", ActionResult.DONE),
            ("adm-refunds", ActionResult.REFUSED)]
        assert ActionLog.objects.filter(action="rewind", actor="otto", dry_run=True).count() == 3

        # Exactly once kept: the pipelines re-read 15..19 and the sinks hold each record once.
        for pipeline in (orders, payments):
            run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
            assert sink_offsets(pipeline.sink_table) == [(o, o + 1) for o in range(20)]
            assert position(pipeline) == 20
    finally:
        for pipeline in (orders, payments, refunds):
            drop_sink(pipeline.sink_table)


def test_an_operator_resets_an_external_group_from_the_admin_after_a_preview(kafka_bootstrap, make_topic):
    topic = make_topic("adm-group")
    group = f"billing-{uuid.uuid4().hex[:6]}"
    produce(kafka_bootstrap, topic, range(40))
    kafka_admin.commit_offsets(group, topic, {0: 25})
    client = client_of(staff_operator())

    listed = client.get("/admin/consumers/groups/")
    assert group in listed.content.decode() and f'href="/groups/{group}/"' in listed.content.decode()
    form = client.post("/admin/consumers/groups/reset/", {"group": [group]})
    assert b'id="group-reset-form"' in form.content
    reset = {"group": [group], "topic": topic, "mode": "to-offset", "value": "10", "partitions": ""}
    preview = client.post("/admin/consumers/groups/reset/", {**reset, "step": "preview"})
    assert preview.context["previews"][0]["preview"]["partitions"][0]["reprocess"] == 15
    assert kafka_admin.committed_offsets(group, topic) == {0: 25}

    done = client.post("/admin/consumers/groups/reset/", {**reset, "step": "execute"}, follow=True)

    assert any(m.startswith(f"Group {group}: offsets reset: to-offset 10") for m in messages_of(done))
    assert kafka_admin.committed_offsets(group, topic) == {0: 10}
    assert sorted(ActionLog.objects.filter(group_id=group, actor="otto").values_list("dry_run", flat=True)) == [
        False, True]


def execute_form(page: str) -> dict:
    """The hidden fields the preview's Execute button posts, as a browser would send them."""
    form = page[page.index('id="execute-form"'):]
    fields: dict = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form[:form.index("</form>")]):
        if name != "csrfmiddlewaretoken":
            fields.setdefault(name, []).append(value)
    return {**fields, "step": "execute"}


def test_the_execute_button_acts_only_on_what_its_preview_showed_not_on_a_refused_selection(
        kafka_bootstrap, make_topic):
    """A pipeline or group refused in the preview (a target past the log end) is not moved by the Execute button
    once the log has grown: the operator never saw its plan (here it would skip 5 records unseen)."""
    orders = consumed_pipeline(kafka_bootstrap, make_topic("adm-x-orders"), "adm-x-orders", 30)
    refunds = consumed_pipeline(kafka_bootstrap, make_topic("adm-x-refunds"), "adm-x-refunds", 20)
    topic, group = make_topic("adm-x-group"), f"billing-{uuid.uuid4().hex[:6]}"
    produce(kafka_bootstrap, topic, range(30))
    kafka_admin.commit_offsets(group, topic, {0: 10})
    refused_group = f"refunds-{uuid.uuid4().hex[:6]}"   # not known to Kafka yet: refused in the preview
    try:
        client = client_of(staff_operator())
        preview = post_action(client, PIPELINES, "rewind", [orders.pk, refunds.pk], step="preview",
                              mode="to-offset", value="25", partitions="")
        assert "Execute: rewind 1 pipeline" in preview.content.decode()
        reset = {"group": [group, refused_group], "mode": "to-offset", "value": "25", "partitions": ""}
        group_preview = client.post("/admin/consumers/groups/reset/", {**reset, "topic": topic, "step": "preview"})
        assert "Execute: reset 1 group" in group_preview.content.decode()
        produce(kafka_bootstrap, refunds.topic, range(21, 31))   # the log grows before the operator confirms
        kafka_admin.commit_offsets(refused_group, refunds.topic, {0: 1})   # and the other group appears

        done = client.post(PIPELINES, execute_form(preview.content.decode()), follow=True)
        client.post("/admin/consumers/groups/reset/", execute_form(group_preview.content.decode()), follow=True)

        assert any(m.startswith("Pipeline adm-x-orders: rewind done") for m in messages_of(done))
        assert (position(orders), position(refunds)) == (25, 20)
        assert kafka_admin.committed_offsets(group, topic) == {0: 25}
        assert kafka_admin.committed_offsets(refused_group, topic) == {}
        assert ActionLog.objects.filter(pipeline=refunds, dry_run=False).count() == 0
    finally:
        drop_sink(orders.sink_table)
        drop_sink(refunds.sink_table)


def test_an_operator_replays_dead_letters_from_kafka_in_the_admin(kafka_bootstrap, make_topic):
    from consumers.engine.python import run_pipeline
    from consumers.models import DeadLetter, Pipeline
    from tests.pipelines import create_pipeline

    topic = make_topic("adm-replay")
    produce(kafka_bootstrap, topic, ["1", "x2", "3", "4!"])
    pipeline = create_pipeline("adm-replay", topic, "sink_adm_replay", "int_value", batch_size=10)
    try:
        run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
        Pipeline.objects.filter(pk=pipeline.pk).update(transform="tests.replay_transforms.lenient_int")
        letters = list(DeadLetter.objects.values_list("pk", flat=True))
        assert len(letters) == 2

        done = post_action(client_of(staff_operator()), "/admin/consumers/deadletter/",
                           "replay_dead_letters_from_kafka", letters, step="execute", expected="2")

        assert "Pipeline adm-replay: replay: 2 replayed into the sink" in messages_of(done)
        assert sink_offsets(pipeline.sink_table) == [(0, 1), (1, 2), (2, 3), (3, 4)]
        assert not DeadLetter.objects.exists()
        assert ActionLog.objects.get(action="replay_dead_letters").params["source"] == "kafka"
    finally:
        drop_sink(pipeline.sink_table)
