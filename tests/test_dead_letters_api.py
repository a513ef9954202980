"""The dead-letter API: GET /api/pipelines/NAME/dead-letters with the page's filters (the JSON export), and POST
.../dead-letters/replay and .../dead-letters/discard for operators, through consumers.operations.dead_letters.
Viewers get 403, bad bodies 400 naming the field, ids that are not the pipeline's 409 — and nothing changes."""
import json
import re

import pytest

from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay, Pipeline
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order, values  # noqa: F401 (fixture)
from tests.test_dead_letters_page import letters, snapshot  # noqa: F401 (fixture)

URL = "/api/pipelines/orders/dead-letters"


def post(client, path, body):
    return client.post(URL + path, data=json.dumps(body), content_type="application/json")


def test_the_list_is_filtered_like_the_page_and_carries_each_dead_letter(viewer_client, letters):  # noqa: F811
    data = viewer_client.get(URL, {"partition": "0", "error": "integer"}).json()
    assert (data["pipeline"], data["count"], data["page"], data["pages"], data["next"]) == ("orders", 2, 1, 1, None)
    assert data["filters"] == {"state": "pending", "error": "integer", "partition": 0}
    first = data["dead_letters"][0]
    assert first == {"id": letters[(0, 3)].pk, "state": "pending", "partition": 0, "offset": 3,
                     "error": "BadRecord: value is not an integer: b'x3'", "key": "k3", "value": "x3",
                     "created_at": letters[(0, 3)].created_at.isoformat(), "state_at": None, "state_by": "",
                     "reason": "", "rows_written": None, "replay_attempts": 0}
    assert [d["offset"] for d in data["dead_letters"]] == [3, 7]


def test_every_state_and_an_offset_range(viewer_client, letters):  # noqa: F811
    data = viewer_client.get(URL, {"state": "any", "offset_from": "12", "offset_to": "90"}).json()
    assert [(d["partition"], d["offset"], d["state"]) for d in data["dead_letters"]] == [
        (0, 12, "replayed"), (0, 40, "pending"), (1, 90, "pending")]
    discarded = viewer_client.get(URL, {"state": "discarded"}).json()["dead_letters"]
    assert [(d["offset"], d["state_by"], d["reason"]) for d in discarded] == [(91, "otto", "test data")]


def test_the_list_is_paged_with_a_next_link_that_keeps_the_filters(viewer_client, letters):  # noqa: F811
    first = viewer_client.get(URL, {"state": "any", "limit": "3"}).json()
    assert (first["count"], first["pages"], len(first["dead_letters"])) == (7, 3, 3)
    assert first["next"] == "http://testserver/api/pipelines/orders/dead-letters?state=any&limit=3&page=2"
    offsets = [d["offset"] for d in first["dead_letters"]]
    following = first["next"]
    while following:
        page = viewer_client.get(following.removeprefix("http://testserver")).json()
        offsets += [d["offset"] for d in page["dead_letters"]]
        following = page["next"]
    assert offsets == [3, 7, 12, 40, 5, 90, 91]
    past = viewer_client.get(URL, {"state": "any", "limit": "3", "page": "9"}).json()
    assert (past["dead_letters"], past["next"], past["count"]) == ([], None, 7)


@pytest.mark.parametrize("query, field", [({"offset_from": "ten"}, "offset_from"), ({"partition": "-1"}, "partition"),
                                          ({"state": "lost"}, "state"), ({"limit": "0"}, "limit"),
                                          ({"offset_from": "9", "offset_to": "3"}, "offset_to")])
def test_a_bad_query_is_a_400_naming_the_parameter(viewer_client, letters, query, field):  # noqa: F811
    response = viewer_client.get(URL, query)
    assert response.status_code == 400
    assert list(response.json()["errors"]) == [field]


def test_an_unknown_pipeline_is_a_404(viewer_client, letters):  # noqa: F811
    assert viewer_client.get("/api/pipelines/nope/dead-letters").status_code == 404


def test_a_viewer_cannot_replay_or_discard_and_nothing_changes(viewer_client, letters):  # noqa: F811
    before = snapshot()
    ids = [letters[(0, 3)].pk]
    assert post(viewer_client, "/replay", {"ids": ids}).status_code == 403
    assert post(viewer_client, "/discard", {"ids": ids, "reason": "test"}).status_code == 403
    assert snapshot() == before
    refused = ActionLog.objects.filter(actor="vera", result=ActionResult.REFUSED).order_by("pk")
    assert list(refused.values_list("action", flat=True)) == ["replay_dead_letters", "discard_dead_letters"]


@pytest.mark.parametrize("path, body, field", [
    ("/replay", {}, "ids"),
    ("/replay", {"ids": []}, "ids"),
    ("/replay", {"ids": ["1"]}, "ids"),
    ("/replay", {"ids": "1,2"}, "ids"),
    ("/replay", {"ids": [1], "source": "tape"}, "source"),
    ("/replay", {"ids": [1], "reason": "x"}, "reason"),         # an unknown field, not a silent default
    ("/discard", {"ids": [1]}, "reason"),
    ("/discard", {"ids": [1], "reason": "  "}, "reason"),
    ("/discard", {"ids": [1], "reason": 7}, "reason"),
])
def test_a_bad_body_is_a_400_naming_the_field_audited_and_changes_nothing(operator_client, letters, path, body,  # noqa: F811
                                                                         field):
    before = snapshot()
    response = post(operator_client, path, body)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert snapshot() == before
    assert ActionLog.objects.get().result == ActionResult.REFUSED


def test_ids_that_are_not_the_pipelines_are_a_409_with_the_reason_and_change_nothing(operator_client, letters):  # noqa: F811
    before = snapshot()
    other, mine = letters["other"].pk, letters[(0, 3)].pk
    replay = post(operator_client, "/replay", {"ids": [mine, other]})
    assert replay.status_code == 409
    assert replay.json()["error"] == f"Not dead letters of pipeline 'orders': {other}. Nothing was changed."
    discard = post(operator_client, "/discard", {"ids": [mine, 987654321], "reason": "cleanup"})
    assert discard.status_code == 409 and "987654321" in discard.json()["error"]
    assert snapshot() == before
    entries = ActionLog.objects.order_by("pk")
    assert [(e.action, e.result) for e in entries] == [("replay_dead_letters", ActionResult.REFUSED),
                                                       ("discard_dead_letters", ActionResult.REFUSED)]
    assert replay.json()["action_id"] == entries[0].pk


def test_an_operator_discards_with_a_reason(operator_client, letters):  # noqa: F811
    chosen = [letters[(0, 7)].pk, letters[(1, 91)].pk]
    data = post(operator_client, "/discard", {"ids": chosen, "reason": "bad producer build"}).json()
    assert data["counts"] == {"discarded": 1, "already_discarded": 1}
    assert data["action_id"] == ActionLog.objects.get(action="discard_dead_letters").pk
    assert DeadLetter.objects.get(pk=chosen[0]).discard_reason == "bad producer build"
    assert DeadLetter.objects.get(pk=chosen[1]).discard_reason == "test data"  # the first reason stays


def test_an_operator_replays_through_the_api_and_each_row_lands_once(operator_client, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))
    data = post(operator_client, "/replay", {"ids": ids}).json()
    assert data["counts"] == {"replayed": 2, "still_bad": 1}
    assert [(d["offset"], d["result"], d["rows"]) for d in data["dead_letters"]] == [
        (3, "replayed", 1), (7, "replayed", 1), (8, "still_bad", 0)]
    again = post(operator_client, "/replay", {"ids": ids}).json()
    assert again["counts"] == {"gone": 2, "still_bad": 1}
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == [o for o in range(10) if o != 8]
    assert DeadLetterReplay.objects.count() == 2
    listed = operator_client.get(URL, {"state": "any"}).json()["dead_letters"]
    assert [(d["offset"], d["state"]) for d in listed] == [(3, "replayed"), (7, "replayed"), (8, "pending")]
    assert listed[2]["replay_attempts"] == 2


def test_the_api_docs_page_lists_the_dead_letter_endpoints(viewer_client):
    html = viewer_client.get("/api/docs/").content.decode()
    for path in ("/api/pipelines/{name}/dead-letters", "/api/pipelines/{name}/dead-letters/replay",
                 "/api/pipelines/{name}/dead-letters/discard"):
        assert f"<code>{path}</code>" in html
    listing = re.search(r"<code>/api/pipelines/\{name\}/dead-letters</code>.*?</tr>", html, re.S).group(0)
    assert "?error, ?limit, ?offset_from, ?offset_to, ?page, ?partition, ?state" in listing


def test_a_replay_from_kafka_of_a_pipeline_whose_cluster_is_not_configured_is_a_409_naming_it(operator_client,
                                                                                              letters):  # noqa: F811
    """It said "Kafka did not answer", as if Kafka were down: Kafka was never asked, the clusters file no longer has
    the cluster. By ids and by a filter, refused before anything is read, audited, nothing changed."""
    Pipeline.objects.filter(name="orders").update(cluster="gone")
    before = snapshot()
    by_ids = post(operator_client, "/replay", {"ids": [letters[(0, 3)].pk], "source": "kafka"})
    by_filter = post(operator_client, "/replay", {"filter": {"partition": 0}, "count": 3, "source": "kafka"})
    for response in (by_ids, by_filter):
        assert response.status_code == 409
        error = response.json()["error"]
        assert error.startswith("Cannot replay dead letters of pipeline 'orders' from Kafka: Kafka cluster 'gone': "
                                "no such cluster (configured: default;")
        assert error.endswith("Nothing was changed.") and "did not answer" not in error
    assert snapshot() == before
    entries = ActionLog.objects.order_by("pk")
    assert [(e.action, e.result) for e in entries] == [("replay_dead_letters", ActionResult.REFUSED)] * 2
    assert [e.message for e in entries] == [by_ids.json()["error"], by_filter.json()["error"]]
    assert by_ids.json()["action_id"] == entries[0].pk
