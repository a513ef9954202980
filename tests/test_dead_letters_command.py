"""`manage.py dead_letters PIPELINE list|export|discard|replay`: the page's filters on the command line, the
same domain functions for replay and discard. Exit 0 done, 1 refused (reason on stderr, nothing changed),
2 usage."""
import csv
import io
import json

import pytest

from consumers.models import ActionLog, ActionResult, DeadLetter, DeadLetterReplay
from tests.commands import run_command
from tests.test_dead_letters import consume, fix_transform, pipeline, sink_rows, values  # noqa: F401 (fixture)
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


def test_discard_by_ids_with_a_reason(capsys, letters):  # noqa: F811
    ids = f"{letters[(0, 3)].pk},{letters[(0, 7)].pk}"
    code, out, _ = run(capsys, "orders", "discard", "--ids", ids, "--reason", "replayed by hand", "--actor", "ops")
    assert code == 0 and "2 dead letter(s) discarded: replayed by hand" in out
    assert set(DeadLetter.objects.filter(discard_reason="replayed by hand").values_list("offset", flat=True)) == {3, 7}
    assert ActionLog.objects.get(action="discard_dead_letters").actor == "ops"


def test_discard_by_filter_takes_the_pending_dead_letters_it_matches(capsys, letters):  # noqa: F811
    code, out, _ = run(capsys, "orders", "discard", "--partition", "1", "--reason", "bad producer", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"discarded": 2}
    assert sorted(DeadLetter.objects.filter(discard_reason="bad producer").values_list("offset", flat=True)) == [5, 90]


@pytest.mark.parametrize("argv, message", [
    (["nope", "list"], "Refused: no pipeline named 'nope'."),
    (["nope", "replay", "--ids", "1"], "Refused: No pipeline named 'nope'."),
    (["orders", "discard", "--ids", "LETTER"], "Refused: Discarding dead letters needs a reason."),
    (["orders", "discard", "--ids", "LETTER", "--reason", "  "], "Refused: Discarding dead letters needs a reason."),
    (["orders", "replay", "--ids", "LETTER,OTHER"], "Refused: Not dead letters of pipeline 'orders': OTHER."),
    (["orders", "replay", "--error", "no such text"], "Refused: No dead letters selected."),
])
def test_refusals_exit_1_with_the_reason_on_stderr_and_change_nothing(capsys, letters, argv, message):  # noqa: F811
    ids = {"LETTER": str(letters[(0, 3)].pk), "OTHER": str(letters["other"].pk)}
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
    (["orders", "replay"], "replay: give --ids, or a filter"),
    (["orders", "list", "--offset-from", "9", "--offset-to", "3"], "--offset-from is above --offset-to"),
    (["orders", "export", "--partition", "-1"], "--partition is 0 or more"),
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
    code, out, _ = run(capsys, "orders", "replay", "--error", "not an integer")
    assert code == 0
    assert "orders: replay: 2 replayed into the sink; 1 still bad (kept with the new error)" in out
    code, out, _ = run(capsys, "orders", "replay", "--error", "no digits", "--json")
    assert code == 0 and json.loads(out)["counts"] == {"still_bad": 1}
    assert [o for _, o, _, _ in sink_rows(orders)] == [o for o in range(10) if o != 8]
    assert DeadLetterReplay.objects.count() == 2
    assert [e.result for e in ActionLog.objects.filter(action="replay_dead_letters")] == [ActionResult.DONE] * 2
