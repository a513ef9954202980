""""Select all N matching" dead letters on the page (every page, not only the ticked boxes), in the API and in the
Django admin: through consumers/operations/dead_letter_batches.py, in audited batches of 1,000, refused when the
count moved since the operator looked, and never without the operator's confirmation on the page."""
# ruff: noqa: F811  (the fixtures imported below are parameters of the tests)
import json

import pytest
from django.utils import timezone

from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay, Pipeline
from consumers.operations import dead_letter_batches as batches
from consumers.operations import dead_letter_queries as queries
from consumers.operations.errors import Refused
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order  # noqa: F401 (fixture)
from tests.test_dead_letters_page import URL, letters, snapshot  # noqa: F401 (fixture)

API = "/api/pipelines/orders/dead-letters/"


def make_letters(count, partition=2):
    orders = Pipeline.objects.get(name="orders")
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=partition, offset=o, value=b"v",
                                               error=f"Boom {'even' if o % 2 == 0 else 'odd'}") for o in range(count)])


def test_the_bar_is_offered_only_when_the_filters_match_more_than_one_page_of_pending_letters(operator_client, letters):
    assert 'id="select-all-matching-bar"' not in operator_client.get(URL).content.decode()   # 5: one page
    make_letters(120)
    html = operator_client.get(URL).content.decode()
    assert "Select all 125 matching dead letters" in html
    assert 'id="select-all-matching-bar"' not in operator_client.get(URL + "?state=any").content.decode()


def test_all_matching_first_asks_for_confirmation_and_changes_nothing(operator_client, letters):
    make_letters(120)
    before = snapshot()
    response = operator_client.post(URL + "discard/", {"all_matching": "1", "expected": "60", "error": "even",
                                                       "reason": "load test", "state": "pending"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "Discard all 60 pending dead letters that match the filters?" in html
    assert 'name="confirmed" value="1"' in html and 'name="error" value="even"' in html
    assert snapshot() == before and not ActionLog.objects.exists()


@pytest.mark.parametrize("state", ["any", "discarded", "replayed"])
def test_all_matching_on_the_page_is_refused_for_letters_that_are_not_pending(operator_client, letters, state):
    make_letters(120)
    DeadLetter.objects.filter(offset__lt=60).update(discarded_at=timezone.now(), discard_reason="old")
    before = snapshot()
    response = operator_client.post(URL + "replay/", {"all_matching": "1", "expected": "125", "confirmed": "1",
                                                      "state": state})
    assert response.status_code == 422
    assert "acts on pending dead letters only" in response.content.decode()
    assert snapshot() == before
    entry = ActionLog.objects.get()
    assert entry.result == ActionResult.REFUSED and entry.params["state"] == state


def test_a_confirmed_discard_of_all_matching_acts_on_every_page_in_batches_of_1000(operator_client, letters):
    make_letters(2500)
    response = operator_client.post(URL + "discard/", {"all_matching": "1", "expected": "1250", "error": "EVEN",
                                                       "confirmed": "1", "reason": "evens", "state": "pending"})
    html = response.content.decode()
    assert response.status_code == 200, html
    assert 'id="dead-letter-batches-outcome"' in html
    assert '<li data-result="discarded">discarded: <b>1,250</b></li>' in html
    assert set(DeadLetter.objects.filter(discard_reason="evens").values_list("offset", flat=True)) == set(
        range(0, 2500, 2))
    assert DeadLetter.objects.filter(pipeline__name="orders", discarded_at__isnull=True).count() == 1250 + 5
    entries = ActionLog.objects.filter(action="discard_dead_letters").order_by("pk")
    assert [(e.result, e.params["counts"]) for e in entries] == [(ActionResult.DONE, {"discarded": 1000}),
                                                                 (ActionResult.DONE, {"discarded": 250})]


def test_a_count_that_moved_since_the_confirmation_is_a_409_that_changes_nothing(operator_client, letters):
    make_letters(120)
    before = snapshot()
    response = operator_client.post(URL + "replay/", {"all_matching": "1", "expected": "124", "confirmed": "1",
                                                      "state": "pending"})
    assert response.status_code == 409
    assert "125 dead letters match the filters now, not the 124 confirmed" in response.content.decode()
    assert snapshot() == before
    entry = ActionLog.objects.get()
    assert (entry.result, entry.params["matching"], entry.params["expected"]) == (ActionResult.REFUSED, 125, 124)


@pytest.mark.parametrize("data, message", [
    ({"all_matching": "1", "confirmed": "1"}, "The number of matching dead letters is missing"),
    ({"all_matching": "1", "expected": "many"}, "The number of matching dead letters is a whole number."),
    ({"all_matching": "1", "expected": "3", "confirmed": "1", "offset_from": "9", "offset_to": "2"},
     "The range ends before it starts"),
])
def test_bad_all_matching_input_is_a_422_audited_that_changes_nothing(operator_client, letters, data, message):
    before = snapshot()
    response = operator_client.post(URL + "replay/", data)
    assert response.status_code == 422 and message in response.content.decode()
    assert snapshot() == before
    assert ActionLog.objects.get().result == ActionResult.REFUSED


def test_a_viewer_cannot_act_on_all_matching(viewer_client, letters):
    before = snapshot()
    response = viewer_client.post(URL + "discard/", {"all_matching": "1", "expected": "5", "confirmed": "1",
                                                     "reason": "r"})
    assert response.status_code == 403 and snapshot() == before


def test_replaying_all_matching_writes_each_sink_row_once(operator_client, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: ("junk" if o == 1234 else f"x{o}") for o in range(2400)}, 1: {0: "1", 1: "y1"}})
    fix_transform(orders)
    response = operator_client.post(URL + "replay/", {"all_matching": "1", "expected": "2401", "confirmed": "1"})
    html = response.content.decode()
    assert response.status_code == 200, html
    assert '<li data-result="replayed">replayed: <b>2,400</b></li>' in html
    expected = [(0, o, 0, o) for o in range(2400) if o != 1234] + [(1, 0, 0, 1), (1, 1, 0, 1)]
    assert [(p, o, r, i) for p, o, r, i in rows_in_provenance_order(orders)] == expected
    assert DeadLetterReplay.objects.count() == 2400 and DeadLetter.objects.get().offset == 1234
    again = operator_client.post(URL + "replay/", {"all_matching": "1", "expected": "1", "confirmed": "1"})
    assert again.status_code == 200 and '<li data-result="still_bad">still_bad: <b>1</b></li>' in again.content.decode()
    assert [(p, o, r, i) for p, o, r, i in rows_in_provenance_order(orders)] == expected


def test_the_api_takes_a_filter_and_a_count_instead_of_ids(operator_client, letters):
    make_letters(1500)
    body = {"filter": {"partition": 2, "error": "odd"}, "count": 750, "reason": "odd ones"}
    response = operator_client.post(API + "discard", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["batches"], data["counts"]) == (1, {"discarded": 750})
    assert set(DeadLetter.objects.filter(discard_reason="odd ones").values_list("offset", flat=True)) == set(
        range(1, 1500, 2))


@pytest.mark.parametrize("body, status, message", [
    ({"filter": {"partition": 2}, "count": 7}, 409, "1500 dead letters match the filters now, not the 7 confirmed"),
    ({"filter": {"error": "no such error"}, "count": 1}, 409, "No pending dead letters"),
    ({"filter": {"partition": 2}}, 400, "count"),
    ({"filter": {"partition": -1}, "count": 1}, 400, "partition"),
    ({"filter": {"partition": 2}, "count": 1500, "ids": [1]}, 400, "either ids or filter"),
    ({"filter": {"state": "replayed"}, "count": 1}, 400, "pending"),
])
def test_api_refusals_of_all_matching_change_nothing(operator_client, letters, body, status, message):
    make_letters(1500)
    before = snapshot()
    response = operator_client.post(API + "replay", json.dumps(body), content_type="application/json")
    assert response.status_code == status, response.content
    assert message in response.content.decode()
    assert snapshot() == before


def test_the_batches_module_refuses_an_unknown_id_among_many_before_the_first_batch(letters):
    make_letters(1500)
    ids = list(DeadLetter.objects.filter(partition=2).values_list("pk", flat=True)) + [letters["other"].pk]
    before = snapshot()
    with pytest.raises(Refused, match="Not dead letters of pipeline 'orders'"):
        batches.act_on_ids("orders", "discard", ids, actor="otto", reason="r")
    assert snapshot() == before


def test_matching_ids_are_exactly_what_the_list_shows(letters):
    make_letters(130)
    orders = Pipeline.objects.get(name="orders")
    filters = queries.Filters(error="odd", partition=2, offset_from=10, offset_to=99)
    listed = sorted(row["letter_id"] for row in queries.dead_letters(orders, filters))
    assert batches.matching_ids(orders, filters) == listed and len(listed) == 45
