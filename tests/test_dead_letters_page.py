"""The dead-letter page of a pipeline: filters, pages, the CSV export, and replay / discard of the selected dead
letters by operators — through consumers.operations.dead_letters, so a replay writes each sink row once, with its
replay-ledger row. Viewers see the page without the buttons; their POSTs and bad input change nothing."""
import csv
import io
import re

import pytest
from django.utils import timezone

from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay, Pipeline
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order, values  # noqa: F401 (fixture)

URL = "/pipelines/orders/dead-letters/"


@pytest.fixture
def letters(db):
    """orders: 6 dead letters on partitions 0 and 1 (one discarded), one replayed; and another pipeline's."""
    orders = Pipeline.objects.create(name="orders", topic="orders-topic", sink_table="sink_orders")
    other = Pipeline.objects.create(name="refunds", topic="refunds-topic", sink_table="sink_refunds")
    made = {}
    for partition, offset, value, error in [(0, 3, b"x3", "BadRecord: value is not an integer: b'x3'"),
                                            (0, 7, b"7?", "BadRecord: value is not an integer: b'7?'"),
                                            (0, 40, b"\xff\xfe", "BadRecord: not UTF-8"),
                                            (1, 5, b"junk", "BadRecord: value is not an integer: b'junk'"),
                                            (1, 90, b"99999999999999999999", "NumericValueOutOfRange: bigint"),
                                            (1, 91, b"spam", "BadRecord: value is not an integer: b'spam'")]:
        made[(partition, offset)] = DeadLetter.objects.create(pipeline=orders, partition=partition, offset=offset,
                                                              key=f"k{offset}".encode(), value=value, error=error)
    made[(1, 91)].discarded_at = timezone.now()
    made[(1, 91)].discarded_by, made[(1, 91)].discard_reason = "otto", "test data"
    made[(1, 91)].save()
    DeadLetterReplay.objects.create(pipeline=orders, dead_letter_id=made[(1, 91)].pk + 1000, partition=0, offset=12,
                                    source="stored", rows_written=1, actor="otto",
                                    original_error="BadRecord: value is not an integer: b'12!'")
    made["other"] = DeadLetter.objects.create(pipeline=other, partition=0, offset=1, value=b"nope", error="BadRecord")
    return made


def snapshot():
    return (list(DeadLetter.objects.order_by("pk").values_list("pk", "discarded_at", "discard_reason", "error")),
            list(DeadLetterReplay.objects.order_by("pk").values_list("pk", "dead_letter_id")))


def shown(html) -> list[tuple[int, int, str]]:
    """(partition, offset, state) of the table's rows, in order."""
    rows = re.findall(r'<tr id="dead-letter-\d+" data-state="(\w+)">(.*?)</tr>', html, re.S)
    found = []
    for state, row in rows:
        numbers = re.findall(r'<td class="num">(\d+)</td>', row)
        found.append((int(numbers[1]), int(numbers[2]), state))
    return found


def test_the_pipeline_page_links_the_dead_letter_page_with_the_pending_count(viewer_client, letters):
    html = viewer_client.get("/pipelines/orders/").content.decode()
    link = re.search(r'<a href="/pipelines/orders/dead-letters/" id="dead-letters-link">(.*?)</a>', html).group(1)
    assert link == "All dead letters: 5 pending, 1 discarded"


def test_the_page_lists_pending_dead_letters_in_partition_and_offset_order(viewer_client, letters):
    response = viewer_client.get(URL)
    html = response.content.decode()
    assert response.status_code == 200
    assert shown(html) == [(0, 3, "pending"), (0, 7, "pending"), (0, 40, "pending"), (1, 5, "pending"),
                           (1, 90, "pending")]
    assert "5 dead letters match" in html and "(5 pending in all)" in html
    assert "nope" not in html  # another pipeline's dead letter
    assert r"\xff\xfe" in html  # an undecodable value is shown escaped, not dropped


@pytest.mark.parametrize("query, expected", [
    ("error=NOT+an+INTEGER", [(0, 3, "pending"), (0, 7, "pending"), (1, 5, "pending")]),
    ("partition=1", [(1, 5, "pending"), (1, 90, "pending")]),
    ("offset_from=5&offset_to=40", [(0, 7, "pending"), (0, 40, "pending"), (1, 5, "pending")]),
    ("state=discarded", [(1, 91, "discarded")]),
    ("state=replayed", [(0, 12, "replayed")]),
    ("state=any&partition=0&offset_to=12", [(0, 3, "pending"), (0, 7, "pending"), (0, 12, "replayed")]),
    ("state=any&error=spam", [(1, 91, "discarded")]),
])
def test_filters_narrow_the_table(viewer_client, letters, query, expected):
    assert shown(viewer_client.get(f"{URL}?{query}").content.decode()) == expected


def test_a_discarded_and_a_replayed_dead_letter_say_who_and_why(viewer_client, letters):
    html = viewer_client.get(f"{URL}?state=any").content.decode()
    discarded = re.search(r'data-state="discarded">.*?</tr>', html, re.S).group(0)
    assert "by otto: test data" in discarded
    replayed = re.search(r'data-state="replayed">.*?</tr>', html, re.S).group(0)
    assert "in the sink (1 row)" in replayed and "by otto" in replayed


@pytest.mark.parametrize("query, message", [
    ("offset_from=ten", "offset_from</b>: An offset is a whole number, e.g. 1200."),
    ("partition=-1", "partition</b>: Ensure this value is greater than or equal to 0."),
    ("offset_from=9&offset_to=3", "offset_to</b>: The range ends before it starts (9 &gt; 3)."),
    ("state=lost", "state</b>: Select a valid choice."),
])
def test_a_bad_filter_is_a_422_that_names_the_field_and_lists_nothing(viewer_client, letters, query, message):
    response = viewer_client.get(f"{URL}?{query}")
    html = response.content.decode()
    assert response.status_code == 422
    assert message in html
    assert shown(html) == []


def test_an_htmx_filter_gets_only_the_panel(viewer_client, letters):
    response = viewer_client.get(f"{URL}?partition=1", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "<html" not in html and 'id="dead-letter-table"' in html
    assert shown(html) == [(1, 5, "pending"), (1, 90, "pending")]
    assert "HX-Request" in response["Vary"]


def test_the_table_is_paged_by_fifty_and_the_pages_keep_the_filters(viewer_client, db):
    orders = Pipeline.objects.create(name="orders", topic="orders-topic", sink_table="sink_orders")
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=0, offset=o, value=b"v", error="BadRecord")
                                    for o in range(120)])
    first = viewer_client.get(f"{URL}?offset_from=10").content.decode()
    assert [o for _, o, _ in shown(first)] == list(range(10, 60))
    assert 'href="/pipelines/orders/dead-letters/?offset_from=10&amp;state=pending&amp;page=2" id="next-page"' in first
    third = viewer_client.get(f"{URL}?offset_from=10&page=3").content.decode()
    assert [o for _, o, _ in shown(third)] == list(range(110, 120))
    assert "Page 3 of 3" in third and 'id="next-page"' not in third


@pytest.mark.parametrize("number, message", [
    ("abc", "Page &#x27;abc&#x27; is not a page number: pages are numbered 1 to 1."),
    ("99999", "There is no page 99999: pages are numbered 1 to 1."),
    ("-1", "There is no page -1: pages are numbered 1 to 1."),
])
def test_a_page_that_is_not_a_page_is_a_400_that_says_which_pages_exist(viewer_client, letters, number, message):
    for fragment in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = viewer_client.get(URL, {"page": number}, **fragment)
        html = response.content.decode()
        assert response.status_code == 400 and message in html and shown(html) == []
    assert len(shown(viewer_client.get(URL, {"page": ""}).content.decode())) == 5  # empty: the first page


def test_the_csv_export_holds_every_matching_dead_letter_not_only_one_page(viewer_client, letters, db):
    orders = Pipeline.objects.get(name="orders")
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=2, offset=o, value=f"v{o}".encode(),
                                               error="BadRecord: many") for o in range(70)])
    response = viewer_client.get(f"{URL}export.csv?partition=2")
    assert response.status_code == 200 and response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="orders-dead-letters.csv"'
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [int(r["offset"]) for r in rows] == list(range(70))
    assert {r["state"] for r in rows} == {"pending"} and rows[5]["value"] == "v5"


def test_a_producers_value_cannot_run_as_a_formula_when_the_csv_export_is_opened_in_a_spreadsheet(viewer_client,
                                                                                                   letters):
    """A topic's producer writes the key and value (and the error quotes them): a cell that a spreadsheet would
    run as a formula (=, +, -, @, a tab or a carriage return first) starts with a quote, as OWASP advises."""
    orders = Pipeline.objects.get(name="orders")
    DeadLetter.objects.create(pipeline=orders, partition=3, offset=1, key=b'=HYPERLINK("http://evil.example/")',
                              value=b"@SUM(1+1)*cmd|' /C calc'!A0", error="+bad\tvalue")
    DeadLetter.objects.create(pipeline=orders, partition=3, offset=2, key=b"-2+3", value=b"\tx", error="plain")
    response = viewer_client.get(f"{URL}export.csv?partition=3")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["key"], r["value"], r["error"]) for r in rows] == [
        ("'=HYPERLINK(\"http://evil.example/\")", "'@SUM(1+1)*cmd|' /C calc'!A0", "'+bad\tvalue"),
        ("'-2+3", "'\tx", "plain")]
    assert [r["offset"] for r in rows] == ["1", "2"]


def test_the_csv_export_has_the_error_value_and_state_of_each_filtered_dead_letter(viewer_client, letters):
    response = viewer_client.get(f"{URL}export.csv?state=any&partition=0")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["partition"], r["offset"], r["state"]) for r in rows] == [
        ("0", "3", "pending"), ("0", "7", "pending"), ("0", "12", "replayed"), ("0", "40", "pending")]
    first = rows[0]
    assert (first["id"], first["key"], first["value"]) == (str(letters[(0, 3)].pk), "k3", "x3")
    assert first["error"] == "BadRecord: value is not an integer: b'x3'"
    assert rows[3]["value"] == r"\xff\xfe"
    assert (rows[2]["value"], rows[2]["rows_written"], rows[2]["state_by"]) == ("", "1", "otto")


def test_a_bad_filter_on_the_export_is_a_422_not_a_file(viewer_client, letters):
    response = viewer_client.get(f"{URL}export.csv?offset_to=x")
    assert response.status_code == 422 and "An offset is a whole number" in response.content.decode()


def test_a_viewer_sees_no_buttons_and_their_posts_are_refused_audited_and_change_nothing(viewer_client, letters):
    html = viewer_client.get(URL).content.decode()
    assert 'id="replay-selected"' not in html and 'id="discard-selected"' not in html and 'name="ids"' not in html
    assert "only operators can replay or discard" in html
    letter = letters[(0, 3)]
    for path, data in [("replay/", {"ids": [letter.pk]}), ("discard/", {"ids": [letter.pk], "reason": "test"})]:
        response = viewer_client.post(URL + path, data)
        assert response.status_code == 403
        assert "only operators can" in response.content.decode()
    letter.refresh_from_db()
    assert letter.discarded_at is None and DeadLetter.objects.count() == 7
    refusals = ActionLog.objects.filter(result=ActionResult.REFUSED, actor="vera").order_by("pk")
    assert list(refusals.values_list("action", flat=True)) == ["replay_dead_letters", "discard_dead_letters"]


def test_an_operator_sees_checkboxes_for_pending_dead_letters_only(operator_client, letters):
    html = operator_client.get(f"{URL}?state=any").content.decode()
    boxes = sorted(int(i) for i in re.findall(r'name="ids" value="(\d+)"', html))
    assert boxes == sorted(d.pk for key, d in letters.items() if key not in ((1, 91), "other"))
    assert 'id="replay-selected"' in html and 'id="discard-selected"' in html


def test_an_operator_discards_selected_dead_letters_with_a_reason(operator_client, letters):
    chosen = [letters[(0, 3)].pk, letters[(1, 5)].pk]
    response = operator_client.post(URL + "discard/",
                                    {"ids": chosen, "reason": "  load-test data  ", "state": "pending"})
    html = response.content.decode()
    assert response.status_code == 200
    assert '<li data-result="discarded">discarded: <b>2</b></li>' in html
    assert shown(html) == [(0, 7, "pending"), (0, 40, "pending"), (1, 90, "pending")]  # the filtered table again
    discarded = DeadLetter.objects.filter(pk__in=chosen)
    assert {(d.discarded_by, d.discard_reason) for d in discarded} == {("otto", "load-test data")}
    entry = ActionLog.objects.get(action="discard_dead_letters")
    assert (entry.actor, entry.result, entry.params["ids"]) == ("otto", ActionResult.DONE, chosen)
    # The page carried by an action may have emptied meanwhile: the outcome is shown with the nearest page.
    last = operator_client.post(URL + "discard/", {"ids": [letters[(0, 7)].pk], "reason": "x", "page": "2"})
    assert last.status_code == 200 and shown(last.content.decode()) == [(0, 40, "pending"), (1, 90, "pending")]


@pytest.mark.parametrize("path, data, message", [
    ("replay/", {}, "Select at least one dead letter."),
    ("replay/", {"ids": ["3x"]}, "Dead letter ids are whole numbers."),
    ("discard/", {"ids": ["LETTER"], "reason": ""}, "Say why these dead letters are discarded."),
    ("discard/", {"ids": ["LETTER"], "reason": "   "}, "Say why these dead letters are discarded."),
    ("replay/", {"ids": ["LETTER", "OTHER"]}, "Not dead letters of pipeline &#x27;orders&#x27;: OTHER."),
    ("discard/", {"ids": ["999999999"], "reason": "typo"},
     "Not dead letters of pipeline &#x27;orders&#x27;: 999999999."),
])
def test_bad_input_is_a_422_with_the_reason_audited_and_changes_nothing(operator_client, letters, path, data, message):
    ids = {"LETTER": str(letters[(0, 3)].pk), "OTHER": str(letters["other"].pk)}
    data = {k: [ids.get(i, i) for i in v] if k == "ids" else v for k, v in data.items()}
    message = message.replace("OTHER", ids["OTHER"])
    before = snapshot()
    response = operator_client.post(URL + path, data)
    html = response.content.decode()
    assert response.status_code == 422
    assert message in html
    assert 'id="dead-letter-outcome"' not in html
    assert snapshot() == before
    assert ActionLog.objects.get().result == ActionResult.REFUSED


def test_an_operator_replays_fixed_dead_letters_into_the_sink_exactly_once(operator_client, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: values(10)})   # offsets 3, 7 and 8 become dead letters
    fix_transform(orders)              # now 3 ("x3") and 7 ("7?") pass; 8 ("junk") still fails
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    response = operator_client.post(URL + "replay/", {"ids": ids})
    html = response.content.decode()
    assert response.status_code == 200
    assert '<li data-result="replayed">replayed: <b>2</b></li>' in html
    assert '<li data-result="still_bad">still_bad: <b>1</b></li>' in html
    assert "BadRecord: no digits" in html
    assert shown(html) == [(0, 8, "pending")]
    rows = rows_in_provenance_order(orders)
    assert [(p, o) for p, o, _, _ in rows] == [(0, o) for o in range(10) if o != 8]
    assert [(o, r) for _, o, _, r in rows if o in (3, 7)] == [(3, 3), (7, 7)]
    assert list(DeadLetterReplay.objects.order_by("offset").values_list("offset", "actor")) == [(3, "otto"),
                                                                                               (7, "otto")]
    entry = ActionLog.objects.get(action="replay_dead_letters")
    assert (entry.result, entry.actor) == (ActionResult.DONE, "otto")
    assert DeadLetterReplay.objects.filter(action_log=entry).count() == 2

    again = operator_client.post(URL + "replay/", {"ids": ids}).content.decode()   # a second click changes nothing
    assert '<li data-result="gone">gone: <b>2</b></li>' in again
    assert [(p, o) for p, o, _, _ in rows_in_provenance_order(orders)] == [(0, o) for o in range(10) if o != 8]
    assert DeadLetterReplay.objects.count() == 2
    replayed = operator_client.get(f"{URL}?state=replayed").content.decode()
    assert shown(replayed) == [(0, 3, "replayed"), (0, 7, "replayed")]


def test_a_replay_the_sink_refuses_is_a_422_that_changes_nothing(operator_client, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: values(5)})
    fix_transform(orders, "tests.replay_transforms.lenient_event")  # writes a column the sink table lacks
    letter = DeadLetter.objects.get()
    response = operator_client.post(URL + "replay/", {"ids": [letter.pk]})
    assert response.status_code == 422
    assert "failed and changed nothing" in response.content.decode()
    assert DeadLetter.objects.filter(pk=letter.pk).exists() and not DeadLetterReplay.objects.exists()
    assert ActionLog.objects.get(action="replay_dead_letters").result == ActionResult.FAILED


def test_the_pages_replay_needs_no_kafka_cluster_so_it_replays_one_that_is_no_longer_configured(operator_client,
                                                                                              pipeline):  # noqa: F811
    """The page replays the stored copies, which read nothing from Kafka: the cluster gone from the clusters file
    (a replay from Kafka is refused then, naming it) does not stop it."""
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    Pipeline.objects.filter(pk=orders.pk).update(cluster="gone")
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))
    html = operator_client.post(URL + "replay/", {"ids": ids}).content.decode()
    assert '<li data-result="replayed">replayed: <b>2</b></li>' in html
    assert DeadLetterReplay.objects.count() == 2


def test_a_refused_discard_keeps_the_selection_and_the_reason_and_shows_why_beside_the_reason(operator_client,
                                                                                              letters):
    chosen = [letters[(0, 3)].pk, letters[(1, 5)].pk]
    response = operator_client.post(URL + "discard/", {"ids": chosen, "reason": "   ", "state": "pending"})
    html = response.content.decode()
    assert response.status_code == 422
    checked = sorted(int(i) for i in re.findall(r'name="ids" value="(\d+)"[^>]* checked', html))
    assert checked == sorted(chosen)   # the operator ticks them once, not again after every refusal
    reason = re.search(r'<input type="text" name="reason" id="discard-reason"[^>]*>\s*(<[^>]*>)(.*?)<', html, re.S)
    assert 'aria-invalid="true"' in reason.group(0) and 'aria-describedby="discard-reason-error"' in reason.group(0)
    assert 'id="discard-reason-error"' in reason.group(1)
    assert reason.group(2) == "Say why these dead letters are discarded."
    # A reason typed, then refused for another reason (an id not of this pipeline), is kept as typed.
    kept = operator_client.post(URL + "discard/", {"ids": [letters["other"].pk], "reason": "load test"})
    assert kept.status_code == 422
    assert re.search(r'id="discard-reason"[^>]* value="load test"', kept.content.decode())


def test_the_pipeline_pages_recent_dead_letters_say_which_were_discarded(viewer_client, letters):
    html = viewer_client.get("/pipelines/orders/").content.decode()
    table = re.search(r'<table class="striped" id="dead-letters">(.*?)</table>', html, re.S).group(1)
    states = {int(offset): state for state, offset in
              re.findall(r'<tr data-state="(\w+)"><td class="num">\d+</td><td class="num">(\d+)</td>', table)}
    assert states == {3: "pending", 7: "pending", 40: "pending", 5: "pending", 90: "pending", 91: "discarded"}
    discarded = re.search(r'<tr data-state="discarded">.*?</tr>', table, re.S).group(0)
    assert ">discarded<" in discarded and " by otto: test data" in discarded
