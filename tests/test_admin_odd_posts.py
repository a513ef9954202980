"""Odd changelist POSTs and lookups in the admin: refused with a 4xx and audited, never a 500, never silent
(consumers/admin_site.py, consumers/admin_base.py)."""
import pytest
from django.test import Client

from consumers.models import ActionLog, ActionResult, Pipeline
from tests.admin_support import staff_operator, staff_viewer
from tests.alert_rows import open_alert
from tests.views_helpers import make_pipeline, make_superuser

pytestmark = pytest.mark.django_db


def client(user):
    answered = Client(raise_request_exception=False)   # a 500 is answered, not raised into the test
    answered.force_login(user)
    return answered


def refusals():
    return list(ActionLog.objects.filter(result=ActionResult.REFUSED).values_list("actor", "message"))


@pytest.mark.parametrize("changelist, action", [("/admin/consumers/pipeline/", "start"),
                                                ("/admin/consumers/deadletter/", "discard_dead_letters"),
                                                ("/admin/alerts/alert/", "acknowledge_alerts")])
@pytest.mark.parametrize("user", [staff_viewer, staff_operator])
@pytest.mark.parametrize("selected", ["\u00b2", "abc", "1" * 30])   # "²".isdigit() is True; int() refuses it
def test_a_selected_id_that_is_not_a_whole_number_is_refused_400_and_audited(changelist, action, user, selected):
    pipeline = make_pipeline("orders")
    open_alert(pipeline)
    who = user()
    response = client(who).post(changelist, {"action": action, "index": "0", "_selected_action": [selected]})
    assert response.status_code == 400
    assert refusals() == [(who.username, "_selected_action: the selected ids are whole numbers")]
    assert Pipeline.objects.get(pk=pipeline.pk).desired_state == pipeline.desired_state


@pytest.mark.parametrize("fields", [{"action": "delete_selected", "index": "0"},   # not offered to a viewer
                                    {"action": "start", "index": "5"}])              # no 6th action form
def test_an_action_a_viewer_is_not_offered_is_refused_and_audited(fields):
    pipeline = make_pipeline("orders")
    response = client(staff_viewer()).post("/admin/consumers/pipeline/",
                                           {**fields, "_selected_action": [str(pipeline.pk)]})
    assert response.status_code == 403
    assert Pipeline.objects.filter(pk=pipeline.pk, desired_state=pipeline.desired_state).exists()
    assert [actor for actor, _ in refusals()] == ["vera"]


@pytest.mark.parametrize("query", ["committed_at__year=9999", "committed_at__year=9999&committed_at__month=12",
                                   "committed_at__year=9999&committed_at__month=12&committed_at__day=31"])
def test_the_ledgers_date_hierarchy_at_year_9999_is_a_bad_lookup_not_a_500(query):
    make_pipeline("orders")
    response = client(make_superuser()).get(f"/admin/consumers/batchledger/?{query}")
    assert response.status_code == 302 and response["Location"].endswith("?e=1")
