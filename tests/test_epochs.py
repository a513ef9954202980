"""Every epoch bump goes through Pipeline.bump_epoch: one UPDATE that may carry other changes and conditions."""
import re
from pathlib import Path

from consumers.models import DesiredState, Pipeline

ROOT = Path(__file__).resolve().parent.parent


def test_a_bump_returns_the_new_epoch_and_applies_its_changes_in_the_same_update(db):
    pipeline = Pipeline.objects.create(name="nums", topic="nums", sink_table="nums_sink", epoch=4)
    stale = Pipeline.objects.get(pk=pipeline.pk)
    assert pipeline.bump_epoch(desired_state=DesiredState.RUNNING, last_error="") == 5
    assert (pipeline.epoch, pipeline.desired_state) == (5, DesiredState.RUNNING)
    assert stale.bump_epoch() == 6   # from the row, never from a stale object's epoch
    assert Pipeline.objects.get(pk=pipeline.pk).epoch == 6


def test_a_conditional_bump_moves_only_pipelines_still_as_expected(db):
    pipeline = Pipeline.objects.create(name="nums", topic="nums", sink_table="nums_sink", epoch=2,
                                       desired_state=DesiredState.RUNNING)
    expected = Pipeline.objects.filter(pk=pipeline.pk, epoch=2, desired_state=DesiredState.RUNNING)
    assert expected.bump_epoch(desired_state=DesiredState.STOPPED) == 1
    assert expected.bump_epoch(desired_state=DesiredState.STOPPED) == 0   # someone acted first
    pipeline.refresh_from_db()
    assert (pipeline.epoch, pipeline.desired_state) == (3, DesiredState.STOPPED)


def test_no_code_bumps_an_epoch_by_hand():
    hand_written = re.compile(r"""epoch\s*=\s*F\(\s*["']epoch["']\s*\)""")
    home = ROOT / "consumers" / "models" / "pipeline.py"
    offenders = [str(path.relative_to(ROOT)) for package in ("consumers", "alerts", "dashboard", "tally")
                 for path in (ROOT / package).rglob("*.py")
                 if path != home and "migrations" not in path.parts and hand_written.search(path.read_text())]
    assert offenders == []
    assert hand_written.search(home.read_text())   # the pattern does find the one real bump
