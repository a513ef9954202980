"""`manage.py dead_letters PIPELINE list|export|discard|replay`: the page's filters on the command line, the
same domain functions for replay and discard. Exit 0 done, 1 refused (reason on stderr, nothing changed),
2 usage."""
import csv
import io
import json

import pytest

from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay, Pipeline
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.errors import Refused
from tests.commands import run_command
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order, values  # noqa: F401 (fixture)
from tests.test_dead_letters_page import letters, snapshot  # noqa: F401 (fixture)

# A command closes the database connections when it ends: each test commits for real.
pytestmark = pytest.mark.django_db(transaction=True)


def run(capsys, *argv):
    return run_command(capsys, "dead_letters", *argv)


def test_list_shows_the_filtered_dead_letters(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "list", "--error", "INTEGER", "--partition", "0")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[:4] == [str(letters[(0, 3)].pk), "pending", "0", "3"]
    assert "BadRecord: value is not an integer: b'x3'" in lines[1] and "'x3'" in lines[1]
    assert [line.split()[3] for line in lines[1:3]] == ["3", "7"]
    assert lines[-1] == "2 dead letter(s) match."


def test_list_json_has_every_state_when_asked(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "list", "--state", "any", "--offset-from", "12", "--offset-to", "91", "--json")
    assert code == 0
    assert [(d["offset"], d["state"]) for d in json.loads(out)] == [(12, "replayed"), (40, "pending"), (90, "pending"),
                                                                   (91, "discarded")]


def test_list_says_how_many_more_than_the_limit_match(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "list", "--limit", "2")
    assert code == 0 and out.splitlines()[-1] == "5 dead letter(s) match; 2 shown (export for all)."
    code, out, _ = run(capsys, "orders", "list", "--limit", "2", "--json")
    assert code == 0 and len(json.loads(out)) == 2   # --json shows what the text shows; export has every row


def test_export_writes_csv_of_every_match_and_json_with_json(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "export", "--partition", "1", "--state", "any")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["offset"], r["state"], r["value"]) for r in rows] == [("5", "pending", "junk"),
                                                                    ("90", "pending", "99999999999999999999"),
                                                                    ("91", "discarded", "spam")]
    assert rows[2]["reason"] == "test data"
    code, out, _ = run(capsys, "orders", "export", "--ids", f"{letters[(0, 40)].pk}", "--json")
    assert code == 0 and [(d["offset"], d["value"]) for d in json.loads(out)] == [(40, r"\xff\xfe")]


def test_the_csv_export_quotes_a_value_a_spreadsheet_would_run_and_json_keeps_it_exact(capsys, letters):  # noqa: F811
    orders = Pipeline.objects.get(name="orders")
    DeadLetter.objects.create(pipeline=orders, partition=3, offset=1, value=b'=HYPERLINK("http://evil.example/")',
                              error="BadRecord")
    code, out, _ = run(capsys, "orders", "export", "--partition", "3")
    assert code == 0 and [r["value"] for r in csv.DictReader(io.StringIO(out))] == ["'=HYPERLINK(\"http://evil.example/\")"]
    code, out, _ = run(capsys, "orders", "export", "--partition", "3", "--json")
    assert code == 0 and [d["value"] for d in json.loads(out)] == ['=HYPERLINK("http://evil.example/")']


def test_discard_by_ids_with_a_reason(capsys, letters):  # noqa: F811
    ids = f"{letters[(0, 3)].pk},{letters[(0, 7)].pk}"
    code, out, _ = run(capsys, "orders", "discard", "--ids", ids, "--reason", "replayed by hand", "--actor", "ops")
    assert code == 0 and "2 dead letter(s) discarded: replayed by hand" in out
    assert set(DeadLetter.objects.filter(discard_reason="replayed by hand").values_list("offset", flat=True)) == {3, 7}
    assert ActionLog.objects.get(action="discard_dead_letters").actor == "ops"


def test_discard_all_matching_takes_the_pending_dead_letters_the_filters_match(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "discard", "--partition", "1", "--all-matching", "--reason", "bad producer",
                       "--json")
    assert code == 0 and json.loads(out)["counts"] == {"discarded": 2}
    assert sorted(DeadLetter.objects.filter(discard_reason="bad producer").values_list("offset", flat=True)) == [5, 90]


@pytest.mark.parametrize("argv, message", [
    (["nope", "list"], "Refused: no pipeline named 'nope'."),
    (["nope", "replay", "--ids", "1"], "Refused: No pipeline named 'nope'."),
    (["orders", "discard", "--ids", "LETTER"], "Refused: Discarding dead letters needs a reason."),
    (["orders", "discard", "--ids", "LETTER", "--reason", "  "], "Refused: Discarding dead letters needs a reason."),
    (["orders", "replay", "--ids", "LETTER,OTHER"], "Refused: Not dead letters of pipeline 'orders': OTHER."),
    (["orders", "replay", "--all-matching", "--error", "no such text"],
     "Refused: No pending dead letters of pipeline 'orders' match the filters; nothing was changed."),
    (["orders", "discard", "--all-matching", "--partition", "7", "--reason", "r"],
     "Refused: No pending dead letters of pipeline 'orders' match the filters; nothing was changed."),
    (["nope", "replay", "--all-matching"], "Refused: No pipeline named 'nope'."),
    (["gone-cluster", "replay", "--ids", "LETTER", "--from-kafka"],
     "Refused: Cannot replay dead letters of pipeline 'orders' from Kafka: Kafka cluster 'gone': no such cluster"),
    (["gone-cluster", "replay", "--all-matching", "--from-kafka"],
     "Refused: Cannot replay dead letters of pipeline 'orders' from Kafka: Kafka cluster 'gone': no such cluster"),
])
def test_refusals_exit_1_with_the_reason_on_stderr_and_change_nothing(capsys, letters, argv, message):  # noqa: F811
    ids = {"LETTER": str(letters[(0, 3)].pk), "OTHER": str(letters["other"].pk)}
    if argv[0] == "gone-cluster":   # the clusters file no longer has its cluster: refused, not "Kafka is down"
        Pipeline.objects.filter(name="orders").update(cluster="gone")
        argv = ["orders", *argv[1:]]
    argv = [",".join(ids.get(i, i) for i in a.split(",")) for a in argv]
    message = message.replace("OTHER", ids["OTHER"])
    before = snapshot()
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert message in err
    assert snapshot() == before


@pytest.mark.parametrize("argv, message", [
    (["orders"], "the following arguments are required: action"),
    (["orders", "bury"], "invalid choice: 'bury'"),
    (["orders", "replay", "--ids", "1,x"], "expected dead letter ids separated by commas"),
    (["orders", "list", "--offset-from", "-3"], "an offset is a whole number from 0"),
    (["orders", "list", "--state", "lost"], "invalid choice: 'lost'"),
    (["orders", "replay"], "replay: give --ids, or --all-matching with the filters of list"),
    (["orders", "discard", "--partition", "1", "--reason", "r"],
     "(add --all-matching to act on every dead letter these filters match)"),
    (["orders", "replay", "--ids", "1", "--all-matching"], "replay: give --ids or --all-matching, not both."),
    (["orders", "list", "--offset-from", "9", "--offset-to", "3"], "The range ends before it starts (9 > 3)"),
    (["orders", "export", "--partition", "-1"], "--partition is 0 or more"),
    (["orders", "list", "--limit", "0"], "--limit is a whole number from 1"),
    (["orders", "list", "--limit", "-5"], "--limit is a whole number from 1"),
])
def test_usage_errors_exit_2_and_change_nothing(capsys, letters, argv, message):  # noqa: F811
    before = snapshot()
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err
    assert snapshot() == before and not ActionLog.objects.exists()


def test_replay_from_the_command_line_writes_each_row_once(capsys, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: values(10)})
    fix_transform(orders)
    code, out, _ = run(capsys, "orders", "replay", "--all-matching", "--error", "not an integer")
    assert code == 0
    assert "orders: replay: 2 replayed into the sink; 1 still bad (kept with the new error)" in out
    code, out, _ = run(capsys, "orders", "replay", "--all-matching", "--error", "no digits", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"still_bad": 1}
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == [o for o in range(10) if o != 8]
    assert DeadLetterReplay.objects.count() == 2
    assert [e.result for e in ActionLog.objects.filter(action="replay_dead_letters")] == [ActionResult.DONE] * 2


def test_all_matching_refuses_when_nothing_matches_and_changes_nothing_but_the_action_log(capsys, letters):  # noqa: F811
    before = snapshot()
    code, _, err = run(capsys, "orders", "discard", "--all-matching", "--error", "no such text", "--reason", "r")
    assert code == 1 and "nothing was changed" in err
    assert snapshot() == before
    entry = ActionLog.objects.get()
    assert entry.result == ActionResult.REFUSED and entry.params["filters"] == {"error": "no such text",
                                                                                "state": "pending"}


def test_all_matching_with_expect_refuses_a_count_that_changed_since(capsys, letters):  # noqa: F811
    _, listed, _ = run(capsys, "orders", "list", "--json")
    count = len(json.loads(listed))
    before = snapshot()
    code, out, err = run(capsys, "orders", "discard", "--all-matching", "--expect", str(count + 1), "--reason", "r")
    assert (code, out) == (1, "")
    assert f"{count} dead letters match the filters now, not the {count + 1} confirmed" in err
    assert snapshot() == before
    assert ActionLog.objects.get().result == ActionResult.REFUSED
    code, out, _ = run(capsys, "orders", "discard", "--all-matching", "--expect", str(count), "--reason", "r",
                       "--json")
    assert code == 0 and json.loads(out)["counts"] == {"discarded": count}


def test_expect_without_all_matching_is_a_usage_error(capsys, letters):  # noqa: F811
    code, _, err = run(capsys, "orders", "discard", "--ids", "1", "--expect", "1", "--reason", "r")
    assert code == 2 and "--expect goes with --all-matching" in err


def test_all_matching_without_a_filter_takes_every_pending_dead_letter_of_the_pipeline(capsys, letters):  # noqa: F811
    before = DeadLetter.objects.get(pk=letters["other"].pk)
    code, out, _ = run(capsys, "orders", "discard", "--all-matching", "--reason", "all of them", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"discarded": 5}
    assert DeadLetter.objects.filter(pipeline__name="orders", discarded_at__isnull=True).count() == 0
    assert DeadLetter.objects.get(pk=letters["other"].pk) == before and before.discarded_at is None


def test_all_matching_honours_every_filter_of_list(capsys, letters):  # noqa: F811
    argv = ["--error", "integer", "--offset-from", "4", "--offset-to", "90"]
    _, listed, _ = run(capsys, "orders", "list", *argv, "--json")
    code, out, _ = run(capsys, "orders", "discard", "--all-matching", *argv, "--reason", "as listed", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"discarded": 2}
    assert sorted(d["id"] for d in json.loads(listed)) == sorted(d["id"] for d in json.loads(out)["dead_letters"])
    assert sorted(DeadLetter.objects.filter(discard_reason="as listed").values_list("offset", flat=True)) == [5, 7]


def make_letters(pipeline_name, count, partition=2):
    orders = Pipeline.objects.get(name=pipeline_name)
    DeadLetter.objects.bulk_create([DeadLetter(pipeline=orders, partition=partition, offset=o, value=b"v",
                                               error=f"Boom {'even' if o % 2 == 0 else 'odd'}")
                                    for o in range(count)])
    return list(DeadLetter.objects.filter(pipeline=orders, partition=partition).order_by("pk")
                .values_list("pk", flat=True))


def test_more_than_1000_ids_go_in_batches_of_1000_each_its_own_action(capsys, letters):  # noqa: F811
    ids = make_letters("orders", 2500)
    code, out, _ = run(capsys, "orders", "discard", "--ids", ",".join(map(str, ids)), "--reason", "load test")
    assert code == 0
    lines = out.splitlines()
    assert [line.split(":")[2].strip() for line in lines[:3]] == [
        f"batch 1/3 (1000 id(s), {ids[0]}..{ids[999]})", f"batch 2/3 (1000 id(s), {ids[1000]}..{ids[1999]})",
        f"batch 3/3 (500 id(s), {ids[2000]}..{ids[2499]})"]
    assert "1000 dead letter(s) discarded: load test" in lines[0] and "500 dead letter(s) discarded" in lines[2]
    assert lines[3] == "orders: discard: done, 3 batch(es), 2500 dead letter(s): 2500 discarded"
    assert DeadLetter.objects.filter(discard_reason="load test").count() == 2500
    entries = ActionLog.objects.filter(action="discard_dead_letters").order_by("pk")
    assert [(e.result, e.params["counts"]) for e in entries] == [
        (ActionResult.DONE, {"discarded": n}) for n in (1000, 1000, 500)]


def test_all_matching_with_filters_over_1000_dead_letters(capsys, letters):  # noqa: F811
    make_letters("orders", 3000)
    argv = ["--partition", "2", "--offset-from", "100", "--offset-to", "2599", "--error", "EVEN"]
    code, out, _ = run(capsys, "orders", "discard", "--all-matching", *argv, "--reason", "evens", "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["batches"], data["batches_done"], data["counts"]) == (2, 2, {"discarded": 1250})
    assert len(data["action_ids"]) == 2 and len(data["dead_letters"]) == 1250
    discarded = set(DeadLetter.objects.filter(discard_reason="evens").values_list("partition", "offset"))
    assert discarded == {(2, o) for o in range(100, 2600, 2)}
    assert DeadLetter.objects.filter(discarded_at__isnull=True).count() == 3000 - 1250 + 5 + 1


def test_an_unknown_id_among_more_than_1000_refuses_them_all(capsys, letters):  # noqa: F811
    ids = make_letters("orders", 1500) + [letters["other"].pk]
    before = snapshot()
    code, out, err = run(capsys, "orders", "discard", "--ids", ",".join(map(str, ids)), "--reason", "r")
    assert (code, out) == (1, "")
    assert f"Refused: Not dead letters of pipeline 'orders': {letters['other'].pk}. Nothing was changed." in err
    assert snapshot() == before
    assert [e.result for e in ActionLog.objects.all()] == [ActionResult.REFUSED]


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), Refused("busy")])
def test_a_failed_batch_stops_the_command_which_says_what_was_done(capsys, letters, monkeypatch, failure):  # noqa: F811
    ids = make_letters("orders", 2100)
    calls = []
    real = dead_letter_ops.discard

    def discard(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(dead_letter_ops, "discard", discard)
    code, out, err = run(capsys, "orders", "discard", "--ids", ",".join(map(str, ids)), "--reason", "part")
    assert code == 1 and len(calls) == 2
    assert out.splitlines()[-1] == ("orders: discard: stopped after 1 of 3 batch(es); done (committed): "
                                    "1000 dead letter(s): 1000 discarded")
    first = ActionLog.objects.get(action="discard_dead_letters", result=ActionResult.DONE).pk
    why = "refused: busy" if isinstance(failure, Refused) else "rolled back: RuntimeError: disk full"
    assert (f"Refused: Discard stopped at batch 2 of 3. Done and kept: batch 1, 1000 dead letter(s): 1000 discarded "
            f"(action log #{first}). Not done: batch 2 (1000 id(s), {ids[1000]}..{ids[1999]}) and the ones after it, "
            f"1100 dead letter(s) untouched, since it was {why}") in err
    assert set(DeadLetter.objects.filter(discard_reason="part").values_list("pk", flat=True)) == set(ids[:1000])


def test_replay_of_more_than_1000_ids_writes_each_sink_row_once(capsys, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: ("junk" if o == 1234 else f"x{o}") for o in range(2400)}, 1: {0: "1", 1: "y1"}})
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ids) == 2401
    code, out, _ = run(capsys, "orders", "replay", "--ids", ",".join(map(str, ids)))
    assert code == 0
    lines = out.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [f"orders: replay: batch {n}/3" for n in (1, 2, 3)]
    assert lines[3] == "orders: replay: done, 3 batch(es), 2401 dead letter(s): 2400 replayed, 1 still bad"
    expected = [(0, o, 0, o) for o in range(2400) if o != 1234] + [(1, 0, 0, 1), (1, 1, 0, 1)]
    assert [(p, o, r, i) for p, o, r, i in rows_in_provenance_order(orders)] == expected
    assert DeadLetterReplay.objects.count() == 2400 and DeadLetter.objects.get().offset == 1234
    assert [e.result for e in ActionLog.objects.filter(action="replay_dead_letters")] == [ActionResult.DONE] * 3
    # Again: every id is known (replayed or still a dead letter), nothing is written twice.
    code, out, _ = run(capsys, "orders", "replay", "--all-matching", "--state", "any", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"gone": 2400, "still_bad": 1}
    assert [(p, o, r, i) for p, o, r, i in rows_in_provenance_order(orders)] == expected
