"""Dead-letter replay under SIGKILL: a process replaying is killed at each step of the protocol (rows half
written, everything written but not committed, committed but not reported); the sink is then checked row
by row, and a second replay leaves every record exactly once."""
import signal
import subprocess
import sys

import pytest

from consumers.models import ActionLog, DeadLetter, DeadLetterReplay
from consumers.operations import dead_letters
from tests.conftest import ROOT
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order, verify  # noqa: F401 (fixture)
from tests.waiting import patience

pytestmark = [pytest.mark.chaos]

RECORDS = 20
BAD = {2: "x3", 5: "6!", 6: "?7", 11: "1 2", 15: "junk", 19: "2-0"}   # lenient_int fixes all but "junk"
EXPECTED = [(0, o, 0, int("".join(c for c in BAD.get(o, str(o + 1)) if c.isdigit())))
            for o in range(RECORDS) if o != 15]

REPLAY_SCRIPT = """
import sys, django
django.setup()
from consumers.operations import dead_letters
from consumers.engine.faults import FaultInjector
ids = [int(i) for i in sys.argv[3].split(",")]
dead_letters.replay(sys.argv[1], ids, actor="otto", faults=FaultInjector.parse(sys.argv[2]))
print("returned")
"""


def replay_in_a_process(env, name, point, ids):
    return subprocess.run([sys.executable, "-c", REPLAY_SCRIPT, name, f"{point}:1", ",".join(map(str, ids))],
                          cwd=ROOT, env=env, capture_output=True, timeout=patience(120))


@pytest.mark.parametrize("point", ["replay-mid-write", "replay-after-write"])
def test_a_replay_killed_before_its_commit_leaves_everything_as_it_was_and_a_rerun_finishes_it(
        pipeline, subprocess_env, point):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: BAD.get(o, str(o + 1)) for o in range(RECORDS)}})
    fix_transform(orders)
    before = rows_in_provenance_order(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    crashed = replay_in_a_process(subprocess_env, orders.name, point, ids)

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    assert b"returned" not in crashed.stdout
    assert rows_in_provenance_order(orders) == before                       # row by row: not one replayed row landed
    assert DeadLetter.objects.count() == len(BAD)
    assert not DeadLetterReplay.objects.exists()
    assert not ActionLog.objects.filter(action="replay_dead_letters").exists()

    result = dead_letters.replay(orders, ids, actor="otto")
    assert result.counts == {"replayed": 5, "still_bad": 1}
    assert rows_in_provenance_order(orders) == EXPECTED
    assert dead_letters.replay(orders, ids, actor="otto").counts == {"gone": 5, "still_bad": 1}
    assert rows_in_provenance_order(orders) == EXPECTED
    checked = verify(orders, 0, RECORDS)
    assert (checked.lost, checked.duplicated, checked.dead_lettered) == (0, 0, 1)


def test_a_replay_killed_after_its_commit_is_complete_and_a_rerun_changes_nothing(pipeline, subprocess_env):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: BAD.get(o, str(o + 1)) for o in range(RECORDS)}})
    fix_transform(orders)
    ids = list(DeadLetter.objects.order_by("offset").values_list("pk", flat=True))

    crashed = replay_in_a_process(subprocess_env, orders.name, "after-replay-commit", ids)

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()[-2000:]
    assert b"returned" not in crashed.stdout
    assert rows_in_provenance_order(orders) == EXPECTED
    assert DeadLetterReplay.objects.count() == 5
    assert ActionLog.objects.filter(action="replay_dead_letters", actor="otto").count() == 1
    rerun = dead_letters.replay(orders, ids, actor="otto")
    assert rerun.counts == {"gone": 5, "still_bad": 1}
    assert rows_in_provenance_order(orders) == EXPECTED
    assert DeadLetterReplay.objects.count() == 5


def test_two_processes_replaying_the_same_dead_letters_at_once_write_each_row_once(pipeline, subprocess_env):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: BAD.get(o, str(o + 1)) for o in range(RECORDS)}})
    fix_transform(orders)
    ids = ",".join(str(i) for i in DeadLetter.objects.values_list("pk", flat=True))
    script = REPLAY_SCRIPT.replace("faults=FaultInjector.parse(sys.argv[2])", "faults=FaultInjector()")
    both = [subprocess.Popen([sys.executable, "-c", script, orders.name, "", ids], cwd=ROOT, env=subprocess_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    for process in both:
        out, err = process.communicate(timeout=patience(120))
        assert process.returncode == 0 and b"returned" in out, err.decode()[-2000:]
    assert rows_in_provenance_order(orders) == EXPECTED
    assert DeadLetterReplay.objects.count() == 5
    counts = [entry.params["counts"] for entry in ActionLog.objects.filter(action="replay_dead_letters")]
    assert sorted(c.get("replayed", 0) for c in counts) == [0, 5]
