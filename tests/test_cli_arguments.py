"""Arguments no command could store are refused before any command runs (consumers/management/cli.py): exit 1,
the reason on stderr, the refusal in the action log, nothing changed. Bytes that are not UTF-8 reach Python as
lone surrogates; an --actor longer than the action log's column failed inside the write with a traceback."""
import pytest

from consumers.models import ActionLog, PartitionOffset, Pipeline
from tests.commands import run_command
from tests.views_helpers import make_pipeline

pytestmark = pytest.mark.django_db(transaction=True)

LONG_ACTOR = "a" * 200
NOT_UTF8 = "orders\udcff"   # what Python makes of the bytes b"orders\xff" on the command line
CASES = [
    (["rewind", "orders", "--to-earliest", "--execute", "--actor", LONG_ACTOR], "rewind", "'actor' takes at most 150"),
    (["pipeline", "start", "orders", "--actor", LONG_ACTOR], "pipeline start", "'actor' takes at most 150"),
    (["rewind", "orders", "--to-earliest", "--execute", "--actor", NOT_UTF8], "rewind", "'actor' holds a lone"),
    (["pipeline", "start", "orders", "--actor", NOT_UTF8], "pipeline start", "'actor' holds a lone"),
    (["pipeline", "show", NOT_UTF8], "pipeline show", "'name' holds a lone"),
    (["watch", "show", NOT_UTF8], "watch show", "'name' holds a lone"),
    (["watch", "delete", NOT_UTF8], "watch delete", "'name' holds a lone"),
    (["reconcile", NOT_UTF8], "reconcile", "holds a lone"),
    (["dead_letters", "orders", "list", "--error", NOT_UTF8], "dead_letters", "'error' holds a lone"),
]


@pytest.mark.parametrize("argv, action, said", CASES, ids=[" ".join(c[0][:2]) + f" {i}" for i, c in
                                                         enumerate(CASES)])
def test_an_argument_no_command_could_store_is_refused_audited_and_changes_nothing(capsys, argv, action, said):
    pipeline = make_pipeline()
    positions = sorted(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    code, out, err = run_command(capsys, *argv)
    assert code == 1 and "Refused: " in err and said in err, (code, err)
    assert "Traceback" not in err and out == ""
    refusal = ActionLog.objects.get(result="refused")
    assert (refusal.action, refusal.params) == (action, {"via": "cli"}) and said in refusal.message
    assert len(refusal.actor) <= 150 and "\udcff" not in refusal.actor
    assert sorted(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset")) == \
        positions
    assert Pipeline.objects.get().desired_state == pipeline.desired_state
    assert ActionLog.objects.exclude(result="refused").count() == 0


def test_an_actor_as_long_as_the_column_is_taken(capsys):
    make_pipeline()
    code, _, err = run_command(capsys, "rewind", "orders", "--to-earliest", "--actor", "a" * 150)
    assert "'actor'" not in err and ActionLog.objects.filter(actor="a" * 150).exists()
