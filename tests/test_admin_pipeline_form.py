"""The Django admin's pipeline forms validate like every other door (consumers.operations.pipeline_setup) and
every change made there is in the action log; a refused form changes nothing."""

import pytest
from django.db import connection

from consumers.engine import sinks
from consumers.engine.transforms import resolve
from consumers.models import ActionLog, ActionResult, DesiredState, Pipeline
from tests.views_helpers import client_of, make_pipeline, make_superuser

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]
ADD = "/admin/consumers/pipeline/add/"


@pytest.fixture
def admin_client():
    return client_of(make_superuser())


def add_form(topic, table, **overrides):
    return {"name": "orders", "cluster": "default", "topic": topic, "sink_table": table,
            "delivery_mode": "exactly_once", "transform": "int_value", "group_id": "", "engine": "python",
            "isolation_level": "read_committed", "on_log_truncated": "stop", "parallel_runs": "1", "create_table": "on",
            **overrides}


def refused_in_the_admin() -> list[tuple[str, str]]:
    """(action, the field named first) of every entry: refusals only, audited as at every door."""
    entries = ActionLog.objects.order_by("pk")
    assert all(entry.result == ActionResult.REFUSED and entry.params["via"] == "admin" for entry in entries)
    assert all(entry.message.startswith("bad input: ") for entry in entries)
    return [(entry.action, entry.message.removeprefix("bad input: ").split(":")[0]) for entry in entries]


@pytest.mark.parametrize("overrides,field", [({"sink_table": "auth_user"}, "sink_table"),
                                             ({"sink_table": "public.auth_user"}, "sink_table"),
                                             ({"sink_table": "knox_authtoken"}, "sink_table"),
                                             ({"topic": "absent-topic"}, "topic"),
                                             ({"sink_table": "axes_anything"}, "sink_table"),
                                             ({"transform": "..x"}, "transform"),
                                             ({"name": "new"}, "name"),
                                             ({"cluster": "nowhere"}, "cluster")])
def test_the_add_form_refuses_what_the_other_doors_refuse(admin_client, make_topic, table, overrides, field):
    response = admin_client.post(ADD, {**add_form(make_topic("adm"), table), **overrides})
    assert response.status_code == 200 and response.context["adminform"].form.errors.get(field), \
        response.context["adminform"].form.errors
    assert not Pipeline.objects.exists()
    assert refused_in_the_admin() == [("create", field)]


def test_a_pipeline_added_in_the_admin_is_created_stopped_and_audited(admin_client, make_topic, table):
    topic = make_topic("adm")
    response = admin_client.post(ADD, add_form(topic, table))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    pipeline = Pipeline.objects.get()
    assert (pipeline.name, pipeline.topic, pipeline.sink_table, pipeline.group_id, pipeline.desired_state) == (
        "orders", topic, table, "orders", DesiredState.STOPPED)
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == ("create", "root", ActionResult.DONE)


def test_the_change_form_edits_only_the_reading_settings_and_audits_them(admin_client, make_topic, table):
    pipeline = make_pipeline("orders", topic=make_topic("adm"), with_history=False)
    Pipeline.objects.filter(pk=pipeline.pk).update(sink_table=table)
    with connection.cursor() as cursor:
        sinks.ensure_sink_table(cursor, table, resolve("int_value"), True)
    change = f"/admin/consumers/pipeline/{pipeline.pk}/change/"
    page = admin_client.get(change).content.decode()
    assert 'name="transform"' in page and 'name="sink_table"' not in page and 'name="topic"' not in page
    refused = admin_client.post(change, {"transform": "..x", "engine": "python", "isolation_level": "read_committed",
                                         "on_log_truncated": "stop", "sink_table": "auth_user", "parallel_runs": "1"})
    assert refused.status_code == 200 and refused.context["adminform"].form.errors.get("transform")
    assert Pipeline.objects.get().transform == "int_value"
    assert refused_in_the_admin() == [("update", "transform")]
    ActionLog.objects.all().delete()
    done = admin_client.post(change, {"transform": "int_value", "engine": "python", "isolation_level": "read_committed",
                                      "on_log_truncated": "skip", "sink_table": "auth_user", "parallel_runs": "1"})
    assert done.status_code == 302
    pipeline = Pipeline.objects.get()
    assert (pipeline.on_log_truncated, pipeline.sink_table) == ("skip", table)  # sink_table is not a field here
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor) == ("update", "root") and "on_log_truncated stop -> skip" in entry.message


def test_a_running_pipeline_cannot_be_changed_in_the_admin(admin_client, make_topic):
    pipeline = make_pipeline("orders", topic=make_topic("adm"), with_history=False)
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state=DesiredState.RUNNING)
    response = admin_client.post(f"/admin/consumers/pipeline/{pipeline.pk}/change/", {
        "transform": "int_value", "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "skip",
        "parallel_runs": "1"})
    assert response.status_code == 200 and "stop it before changing it" in response.content.decode()
    assert Pipeline.objects.get().on_log_truncated == "stop"
    assert [action for action, _ in refused_in_the_admin()] == ["update"]


def test_deleting_in_the_admin_goes_through_the_audited_delete(admin_client):
    pipeline = make_pipeline("orders", with_history=False)
    response = admin_client.post(f"/admin/consumers/pipeline/{pipeline.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Pipeline.objects.exists()
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.params["pipeline"]) == ("delete", "root", "orders")


def test_a_refused_delete_in_the_admin_says_so_is_audited_and_never_reports_success(admin_client):
    running = make_pipeline("orders", with_history=False)
    Pipeline.objects.filter(pk=running.pk).update(desired_state=DesiredState.RUNNING)
    stopped = make_pipeline("clicks", with_history=False)
    one = admin_client.post(f"/admin/consumers/pipeline/{running.pk}/delete/", {"post": "yes"}, follow=True)
    page = one.content.decode()
    assert one.status_code == 200 and "is running" in page and "successfully" not in page
    bulk = admin_client.post("/admin/consumers/pipeline/", {"action": "delete_selected", "post": "yes",
                                                           "_selected_action": [running.pk, stopped.pk]}, follow=True)
    page = bulk.content.decode()
    assert "is running" in page and "Successfully deleted" not in page
    assert list(Pipeline.objects.values_list("name", flat=True)) == ["orders"]
    refusals = ActionLog.objects.filter(action="delete", result=ActionResult.REFUSED)
    assert refusals.count() == 2 and all(r.params == {"via": "admin", "pipeline": "orders"} for r in refusals)
    assert ActionLog.objects.filter(action="delete", result=ActionResult.DONE, params__pipeline="clicks").exists()
