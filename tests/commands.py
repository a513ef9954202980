"""Run a Tally management command as `manage.py` would, and read its exit code and output."""
import pytest
from django.core.management import load_command_class


def run_command(capsys, name: str, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `manage.py NAME ARGV...`; a command that returns normally exits 0."""
    command = load_command_class("consumers", name)
    with pytest.raises(SystemExit) as exited:
        command.run_from_argv(["manage.py", name, *argv])
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def pipeline_command(capsys, *argv: str) -> tuple[int, str, str]:
    """`manage.py pipeline ARGV...`, as run_command."""
    return run_command(capsys, "pipeline", *argv)
