"""The architecture's import rules (import-linter contracts in pyproject.toml) hold, and the tasks the domain
enqueues by name exist."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(*args):
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_every_import_contract_of_the_project_is_kept():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_lint_imports_reports_a_dependency_that_points_the_wrong_way(tmp_path):
    # The engine imports the Kafka helpers: a contract that puts kafka above engine must be reported broken,
    # so the check above cannot pass by not looking.
    config = tmp_path / "importlinter.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["consumers"]\n\n'
                      '[[tool.importlinter.contracts]]\nname = "kafka above engine (wrong on purpose)"\n'
                      'type = "layers"\nlayers = ["consumers.kafka", "consumers.engine"]\n')
    result = lint_imports("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert "consumers.engine" in result.stdout and "consumers.kafka" in result.stdout


def test_the_tasks_the_domain_enqueues_by_name_are_registered():
    from consumers.demo.runs import RUN_DEMO_TASK
    from consumers.operations.actions import RUN_PIPELINE_TASK
    from consumers.reconciliation.topic_check import RUN_TOPIC_CHECK_TASK
    from tally.celery import app

    app.loader.import_default_modules()
    for name in (RUN_PIPELINE_TASK, RUN_TOPIC_CHECK_TASK, RUN_DEMO_TASK):
        assert name in app.tasks, name
