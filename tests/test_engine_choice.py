"""Which engine runs a pipeline: one choice, shared by the Celery run and `run_pipeline`."""
import inspect
import subprocess
import sys

import pytest

from consumers.engine import python as python_engine
from consumers.engine import spark as spark_engine
from consumers.engine.options import RunOptions, engine_for, with_keywords
from tests.commands import run_command
from tests.conftest import ROOT


def test_each_engine_name_maps_to_its_engine_and_keywords_build_the_same_options():
    assert engine_for("python") is python_engine.run
    assert engine_for("spark") is spark_engine.run
    assert inspect.unwrap(python_engine.run_pipeline) is python_engine.run
    assert inspect.unwrap(spark_engine.run_pipeline) is spark_engine.run
    seen = []
    with_keywords(lambda name, options: seen.append((name, options)))("orders", batch_size=7, stop_when_caught_up=True)
    assert seen == [("orders", RunOptions(batch_size=7, stop_when_caught_up=True))]


@pytest.mark.django_db
def test_run_pipeline_refuses_an_unknown_pipeline_with_a_clear_message(subprocess_env):
    result = subprocess.run([sys.executable, "manage.py", "run_pipeline", "no-such-pipeline", "--max-seconds", "1"],
                            cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "No pipeline named 'no-such-pipeline'" in result.stderr


def test_run_pipeline_refuses_an_unknown_crash_point(subprocess_env):
    result = subprocess.run([sys.executable, "manage.py", "run_pipeline", "any", "--crash-at", "before-lunch"],
                            cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Unknown crash point 'before-lunch'" in result.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("engine, processes, message", [
    ("python", "0", "--processes must be at least 1."),
    ("python", "100000", "(TALLY_MAX_RUNS_PER_PIPELINE), got 100000."),   # never 100,000 processes
    ("spark", "2", "--processes is for the Python engine"),
    ("python", "2", "No pipeline named 'no-such-pipeline'"),
])
def test_run_pipeline_refuses_processes_it_cannot_start(capsys, engine, processes, message):
    code, out, err = run_command(capsys, "run_pipeline", "no-such-pipeline", "--engine", engine,
                                 "--processes", processes)
    assert code == 1 and message in err and not out
