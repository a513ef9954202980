"""Operator actions in the Django admin, through the same domain functions as the dashboard: per-pipeline
results for several pipelines, refusals audited with the actor, viewers without actions, and links between
the admin and the dashboard. (Rewinds and group resets against the broker: test_admin_kafka.py.)"""
import re

import pytest

from alerts.models import Alert, AlertState, Mute
from consumers.models import ActionLog, ActionResult, DeadLetter, DesiredState, Pipeline
from consumers.operations import actions
from tests.admin_support import messages_of, post_action, staff_operator, staff_viewer
from tests.alert_rows import open_alert
from tests.views_helpers import client_of, make_pipeline

PIPELINES = "/admin/consumers/pipeline/"
DEAD_LETTERS = "/admin/consumers/deadletter/"
ALERTS = "/admin/alerts/alert/"

pytestmark = pytest.mark.django_db


@pytest.fixture
def enqueued(monkeypatch):
    calls = []
    monkeypatch.setattr(actions, "enqueue_run", lambda pipeline_id, epoch, runs=1: calls.append(pipeline_id))
    return calls


def test_an_operator_starts_three_pipelines_and_each_result_is_reported_on_its_own(
        enqueued, django_capture_on_commit_callbacks):
    orders, payments, refunds = make_pipeline("orders"), make_pipeline("payments"), make_pipeline("refunds")
    Pipeline.objects.filter(pk=payments.pk).update(desired_state=DesiredState.RUNNING)
    client = client_of(staff_operator())

    with django_capture_on_commit_callbacks(execute=True):
        response = post_action(client, PIPELINES, "start", [orders.pk, payments.pk, refunds.pk], index="0")

    assert response.status_code == 200
    shown = messages_of(response)
    assert any(m.startswith("Pipeline orders: start: desired state running") for m in shown)
    assert any(m.startswith("Pipeline refunds: start: desired state running") for m in shown)
    assert any(m.startswith("Pipeline payments: Cannot start pipeline 'payments': it is already running")
               for m in shown)
    states = dict(Pipeline.objects.values_list("name", "desired_state"))
    assert states == {"orders": "running", "payments": "running", "refunds": "running"}
    log = {(e.pipeline.name, e.result) for e in ActionLog.objects.filter(action="start", actor="otto")}
    assert log == {("orders", ActionResult.DONE), ("refunds", ActionResult.DONE), ("payments", ActionResult.REFUSED)}
    assert sorted(enqueued) == sorted([orders.pk, refunds.pk])


def test_pause_stop_resume_and_restart_from_the_admin_move_state_and_epoch(enqueued):
    orders = make_pipeline("orders")
    client = client_of(staff_operator())
    for action, state in [("start", "running"), ("pause", "paused"), ("resume", "running"), ("restart", "running"),
                          ("stop", "stopped")]:
        post_action(client, PIPELINES, action, [orders.pk], index="0")
        orders.refresh_from_db()
        assert orders.desired_state == state, action
    assert orders.epoch == 5
    assert list(ActionLog.objects.order_by("created_at").values_list("action", flat=True)) == [
        "start", "pause", "resume", "restart", "stop"]


def test_a_viewer_sees_read_only_pages_without_actions_and_a_posted_action_is_refused_and_audited(enqueued):
    orders = make_pipeline("orders")
    client = client_of(staff_viewer())
    page = client.get(PIPELINES)
    assert page.status_code == 200 and b"orders" in page.content
    assert b'name="action"' not in page.content   # no action dropdown, no checkboxes
    assert client.get(DEAD_LETTERS).status_code == 200
    assert b'name="action"' not in client.get(DEAD_LETTERS).content

    refused = post_action(client, PIPELINES, "start", [orders.pk], index="0")

    assert refused.status_code == 403
    orders.refresh_from_db()
    assert orders.desired_state == DesiredState.STOPPED and enqueued == []
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result, entry.pipeline_id) == ("start", "vera", ActionResult.REFUSED,
                                                                            orders.pk)
    letter = DeadLetter.objects.get(pipeline=orders)
    assert post_action(client, DEAD_LETTERS, "replay_dead_letters", [letter.pk], index="0").status_code == 403
    assert ActionLog.objects.filter(action="replay_dead_letters", actor="vera", result=ActionResult.REFUSED).exists()
    assert DeadLetter.objects.filter(pk=letter.pk).exists()


@pytest.mark.parametrize("changelist, actions_posted, index, logged_as", [
    (PIPELINES, ["start", "stop"], "0", "start"),            # Django runs the index-th action, not the last
    (PIPELINES, ["no_such_action", "rewind"], "1", "rewind"),
    (DEAD_LETTERS, ["discard_dead_letters", "x"], "0", "discard_dead_letters"),
    (ALERTS, ["mute_alerts", "acknowledge_alerts"], "0", "mute_alert"),
])
def test_a_viewer_repeating_the_action_parameter_is_refused_as_django_reads_it_and_audited(
        enqueued, changelist, actions_posted, index, logged_as):
    orders = make_pipeline("orders")
    ids = {PIPELINES: [orders.pk], DEAD_LETTERS: list(DeadLetter.objects.values_list("pk", flat=True)),
           ALERTS: [open_alert("orders").pk]}[changelist]
    client = client_of(staff_viewer())

    refused = post_action(client, changelist, actions_posted, ids, index=index)

    assert refused.status_code == 403
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == (logged_as, "vera", ActionResult.REFUSED)
    orders.refresh_from_db()
    assert orders.desired_state == DesiredState.STOPPED and enqueued == [] and not Mute.objects.exists()
    assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()


def test_an_operator_sees_the_actions_in_the_changelists():
    make_pipeline("orders")
    client = client_of(staff_operator())
    page = client.get(PIPELINES).content.decode()
    for action in ("start", "stop", "pause", "resume", "restart", "rewind"):
        assert f'value="{action}"' in page
    letters = client.get(DEAD_LETTERS).content.decode()
    assert 'value="replay_dead_letters"' in letters and 'value="discard_dead_letters"' in letters


def test_the_rewind_action_asks_for_the_form_and_bad_input_is_refused_audited_and_moves_nothing():
    orders, payments = make_pipeline("orders"), make_pipeline("payments")
    client = client_of(staff_operator())

    form = post_action(client, PIPELINES, "rewind", [orders.pk, payments.pk], index="0")
    assert form.status_code == 200
    assert b'id="rewind-form"' in form.content and b"payments" in form.content

    bad = post_action(client, PIPELINES, "rewind", [orders.pk, payments.pk], mode="to-offset", value="minus one",
                      partitions="", step="preview")
    assert b"to-offset needs an integer" in bad.content
    refusals = ActionLog.objects.filter(action="rewind", result=ActionResult.REFUSED, actor="otto")
    assert sorted(refusals.values_list("pipeline__name", flat=True)) == ["orders", "payments"]
    assert all(e.dry_run for e in refusals)
    assert set(orders.offsets.values_list("next_offset", flat=True)) == {100}


def test_dead_letters_are_replayed_per_pipeline_and_discarded_only_with_a_reason(transactional_db):
    from django.db import connection

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve

    orders, payments = make_pipeline("orders"), make_pipeline("payments")
    with connection.cursor() as cursor:
        for pipeline in (orders, payments):
            sinks.ensure_sink_table(cursor, pipeline.sink_table, resolve("int_value"), True)
    try:
        Pipeline.objects.filter(pk=orders.pk).update(transform="tests.replay_transforms.lenient_int")
        client = client_of(staff_operator())
        letters = list(DeadLetter.objects.order_by("pipeline__name").values_list("pk", flat=True))

        page = post_action(client, DEAD_LETTERS, "replay_dead_letters", letters, index="0")
        assert b'id="replay-form"' in page.content and b'name="expected" value="2"' in page.content
        replayed = post_action(client, DEAD_LETTERS, "replay_dead_letters", letters, step="execute", expected="2")

        shown = messages_of(replayed)
        # orders' fixed transform still finds no digits in "not-a-number"; payments' int_value rejects it too
        assert any(m.startswith("Pipeline orders: replay: 1 still bad") for m in shown)
        assert any(m.startswith("Pipeline payments: replay: 1 still bad") for m in shown)
        assert ActionLog.objects.filter(action="replay_dead_letters", actor="otto").count() == 2

        no_reason = post_action(client, DEAD_LETTERS, "discard_dead_letters", letters, step="execute", reason=" ",
                                expected="2")
        assert any("Discarding dead letters needs a reason" in m for m in messages_of(no_reason))
        assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()

        page = post_action(client, DEAD_LETTERS, "discard_dead_letters", letters, index="0")
        assert b'id="discard-form"' in page.content
        done = post_action(client, DEAD_LETTERS, "discard_dead_letters", letters, step="execute",
                           reason="garbage from the load test", expected="2")
        assert "Pipeline orders: 1 dead letter(s) discarded: garbage from the load test" in messages_of(done)
        assert set(DeadLetter.objects.values_list("discard_reason", "discarded_by")) == {
            ("garbage from the load test", "otto")}
        results = sorted(ActionLog.objects.filter(action="discard_dead_letters").values_list("result", flat=True))
        assert results == [ActionResult.DONE] * 2 + [ActionResult.REFUSED] * 2
    finally:
        from tests.conftest import drop_sink_tables
        drop_sink_tables([orders.sink_table, payments.sink_table])


def test_operators_acknowledge_and_mute_alerts_from_the_admin_and_viewers_are_refused():
    first, second = open_alert("orders"), open_alert("payments")
    viewer = client_of(staff_viewer())
    assert viewer.get(ALERTS).status_code == 200
    assert post_action(viewer, ALERTS, "acknowledge_alerts", [first.pk], index="0").status_code == 403
    assert ActionLog.objects.get(action="acknowledge_alert").result == ActionResult.REFUSED

    client = client_of(staff_operator())
    post_action(client, ALERTS, "acknowledge_alerts", [first.pk, second.pk], index="0")
    assert set(Alert.objects.values_list("state", "acknowledged_by")) == {(AlertState.ACKNOWLEDGED, "otto")}
    post_action(client, ALERTS, "mute_alerts", [first.pk], index="0", minutes="90", reason="maintenance")
    mute = Mute.objects.get()
    assert (mute.pipeline.name, mute.created_by, mute.reason) == ("orders", "otto", "maintenance")
    bad = post_action(client, ALERTS, "mute_alerts", [second.pk], index="0", minutes="0")
    assert any("1 minute to 30 days" in m for m in messages_of(bad)) and Mute.objects.count() == 1
    logged = sorted(ActionLog.objects.filter(actor="otto").values_list("action", "result"))
    assert logged == [("acknowledge_alert", "done"), ("acknowledge_alert", "done"), ("mute_alert", "done"),
                      ("mute_alert", "refused")]


@pytest.mark.parametrize("fields, problem", [
    ({"minutes": "abc", "reason": "maintenance"}, "Mute for 1 minute to 30 days."),
    ({"minutes": "90", "reason": "x" * 201}, "The reason is longer than 200 characters."),
])
def test_a_mute_from_the_admin_with_bad_input_says_why_mutes_nothing_and_is_audited(fields, problem):
    alert = open_alert("orders")
    client = client_of(staff_operator())

    refused = post_action(client, ALERTS, "mute_alerts", [alert.pk], index="0", **fields)

    assert f"{problem} Nothing was muted." in messages_of(refused)
    assert not Mute.objects.exists()
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result, entry.message) == ("mute_alert", "otto", ActionResult.REFUSED,
                                                                        f"bad input: {problem}")
    assert entry.pipeline == alert.pipeline and entry.params["alert"] == alert.pk


def test_a_viewer_cannot_reset_consumer_groups_and_the_refusal_is_audited():
    client = client_of(staff_viewer())
    response = client.post("/admin/consumers/groups/reset/", {"group": ["billing-etl"], "step": "execute",
                                                             "topic": "t", "mode": "to-earliest"})
    assert response.status_code == 403
    entry = ActionLog.objects.get()
    assert (entry.group_id, entry.action, entry.actor, entry.result) == ("billing-etl", "reset_group", "vera",
                                                                         ActionResult.REFUSED)


def test_admin_rows_link_to_the_dashboard_and_the_pipeline_page_links_back_for_staff():
    orders = make_pipeline("orders")
    client = client_of(staff_operator())
    assert b'href="/pipelines/orders/"' in client.get(PIPELINES).content
    assert b'href="/pipelines/orders/"' in client.get(DEAD_LETTERS).content
    page = client.get("/pipelines/orders/").content.decode()
    assert f'href="/admin/consumers/pipeline/{orders.pk}/change/"' in page
    assert f'href="/admin/consumers/deadletter/?pipeline__id__exact={orders.pk}"' in page
    filtered = client.get(f"/admin/consumers/deadletter/?pipeline__id__exact={orders.pk}")
    assert filtered.status_code == 200 and b"not-a-number" in filtered.content

    from tests.views_helpers import make_operator
    not_staff = client_of(make_operator("olaf"))
    assert b'id="admin-link"' not in not_staff.get("/pipelines/orders/").content


def test_the_desired_state_is_not_editable_in_the_change_form():
    orders = make_pipeline("orders")
    client = client_of(staff_operator())
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    user = get_user_model().objects.get(username="otto")
    user.user_permissions.add(Permission.objects.get(codename="change_pipeline"))
    page = client.get(f"/admin/consumers/pipeline/{orders.pk}/change/").content.decode()
    assert 'name="desired_state"' not in page and 'name="transform"' in page


def test_the_admin_index_lists_consumer_groups_beside_the_models_for_viewers_and_operators():
    for user in (staff_viewer(), staff_operator()):
        index = client_of(user).get("/admin/").content.decode()
        assert 'href="/admin/consumers/groups/"' in index and "Consumer groups (not run by Tally)" in index
        assert 'href="/admin/consumers/pipeline/"' in index


def test_the_admins_select_all_discards_more_than_1000_dead_letters_in_batches_each_audited(db):
    orders, other = make_pipeline("orders"), make_pipeline("refunds")
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=0, offset=o, value=b"v", error="Boom")
                                    for o in range(100, 2600)])
    total = DeadLetter.objects.filter(pipeline=orders).count()   # make_pipeline's own one and the 2,500
    assert total == 2501 and DeadLetter.objects.filter(pipeline=other).exists()
    client = client_of(staff_operator())
    changelist = f"{DEAD_LETTERS}?pipeline__id__exact={orders.pk}"   # filtered to orders, then "Select all 2500"
    first_page = list(DeadLetter.objects.filter(pipeline=orders).order_by("-pk").values_list("pk", flat=True)[:100])
    page = post_action(client, changelist, "discard_dead_letters", first_page, index="0", select_across="1")
    assert page.status_code == 200
    assert page.content.count(b"<li><a href=") == 100 and re.search(rb"and 2,?401 more", page.content)
    assert b'name="select_across" value="1"' in page.content
    assert b'name="expected" value="2501"' in page.content
    done = post_action(client, changelist, "discard_dead_letters", first_page, step="execute", reason="load test",
                       select_across="1", expected="2501")
    assert any(m.startswith("Pipeline orders: discard: 2501 dead letter(s) in 3 batch(es): 2501 discarded")
               for m in messages_of(done)), messages_of(done)
    assert DeadLetter.objects.filter(discard_reason="load test", discarded_by="otto").count() == 2501
    assert not DeadLetter.objects.filter(pipeline=other, discarded_at__isnull=False).exists()
    entries = ActionLog.objects.filter(action="discard_dead_letters").order_by("pk")
    assert [(e.result, e.params["counts"]) for e in entries] == [
        (ActionResult.DONE, {"discarded": n}) for n in (1000, 1000, 501)]


def test_the_admins_select_all_discard_is_refused_and_audited_when_dead_letters_arrived_after_the_confirmation(db):
    orders = make_pipeline("orders")
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=0, offset=o, value=b"v", error="Boom")
                                    for o in range(100, 103)])
    client = client_of(staff_operator())
    changelist = f"{DEAD_LETTERS}?pipeline__id__exact={orders.pk}"
    shown = list(DeadLetter.objects.filter(pipeline=orders).values_list("pk", flat=True))
    page = post_action(client, changelist, "discard_dead_letters", shown, index="0", select_across="1")
    assert b"Discard 4 dead letters" in page.content
    expected = re.search(rb'name="expected" value="(\d+)"', page.content).group(1).decode()
    # Two more arrive while the operator types the reason: "select all" would now take them too.
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=1, offset=o, value=b"v", error="Late")
                                    for o in (200, 201)])

    refused = post_action(client, changelist, "discard_dead_letters", shown, step="execute", reason="load test",
                          select_across="1", expected=expected)

    assert "6 dead letters are selected now, not the 4 confirmed" in " ".join(messages_of(refused))
    assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()
    entry = ActionLog.objects.get(action="discard_dead_letters")
    assert (entry.result, entry.actor, entry.pipeline_id) == (ActionResult.REFUSED, "otto", orders.pk)
    assert (entry.params["expected"], entry.params["selected"]) == ("4", 6)

    no_count = post_action(client, changelist, "discard_dead_letters", shown, step="execute", reason="load test",
                           select_across="1")
    assert "carries no count" in " ".join(messages_of(no_count))
    assert not DeadLetter.objects.filter(discarded_at__isnull=False).exists()
    assert ActionLog.objects.filter(action="discard_dead_letters", result=ActionResult.REFUSED).count() == 2



def test_the_admins_select_all_replay_is_refused_and_audited_when_dead_letters_arrived_after_the_confirmation(
        transactional_db):
    from django.db import connection

    from consumers.engine import sinks
    from consumers.engine.transforms import resolve
    from tests.conftest import drop_sink_tables

    orders = make_pipeline("orders")
    Pipeline.objects.filter(pk=orders.pk).update(transform="tests.replay_transforms.lenient_int")
    with connection.cursor() as cursor:
        sinks.ensure_sink_table(cursor, orders.sink_table, resolve("int_value"), True)
    DeadLetter.objects.filter(pipeline=orders).delete()
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=0, offset=o, value=f"#{o}".encode(),
                                               error="Boom") for o in range(10, 14)])
    client = client_of(staff_operator())
    changelist = f"{DEAD_LETTERS}?pipeline__id__exact={orders.pk}"   # filtered, then "Select all 4"
    shown = list(DeadLetter.objects.values_list("pk", flat=True))
    try:
        page = post_action(client, changelist, "replay_dead_letters", shown, index="0", select_across="1")
        assert b"Replay 4 dead letters" in page.content
        expected = re.search(rb'name="expected" value="(\d+)"', page.content).group(1).decode()
        # Two more arrive while the operator reads the page: "select all" would now replay them too, unseen.
        DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=1, offset=o, value=f"#{o}".encode(),
                                                   error="Late") for o in (20, 21)])

        for action in ("replay_dead_letters", "replay_dead_letters_from_kafka"):
            refused = post_action(client, changelist, action, shown, step="execute", select_across="1",
                                  expected=expected)
            assert "6 dead letters are selected now, not the 4 confirmed" in " ".join(messages_of(refused))
        assert DeadLetter.objects.count() == 6 and not DeadLetter.objects.filter(replay_attempts__gt=0).exists()
        entries = ActionLog.objects.filter(action="replay_dead_letters")
        assert [(e.result, e.actor, e.pipeline_id, e.params["expected"], e.params["selected"]) for e in entries] == [
            (ActionResult.REFUSED, "otto", orders.pk, "4", 6)] * 2

        done = post_action(client, changelist, "replay_dead_letters", shown, step="execute", select_across="1",
                           expected="6")
        assert "Pipeline orders: replay: 6 replayed into the sink" in messages_of(done), messages_of(done)
        assert not DeadLetter.objects.exists()
    finally:
        drop_sink_tables([orders.sink_table])


def test_a_replay_from_kafka_in_the_admin_of_a_pipeline_whose_cluster_is_gone_is_refused_naming_it():
    orders = make_pipeline("orders")
    Pipeline.objects.filter(pk=orders.pk).update(cluster="gone")
    letters = list(DeadLetter.objects.values_list("pk", flat=True))
    done = post_action(client_of(staff_operator()), DEAD_LETTERS, "replay_dead_letters_from_kafka", letters,
                       step="execute", expected="1")
    assert any("Cannot replay dead letters of pipeline 'orders' from Kafka: Kafka cluster 'gone': no such cluster"
               in m for m in messages_of(done)), messages_of(done)
    assert DeadLetter.objects.count() == 1
    assert ActionLog.objects.get(action="replay_dead_letters").result == ActionResult.REFUSED
