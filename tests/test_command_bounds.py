"""Numbers a command cannot honour are refused (exit code 1) before it touches anything: no database access is
allowed in these tests, so a command that went on would fail here with pytest-django's "Database access not allowed"."""
import pytest
from django.core.management import CommandError, call_command


@pytest.mark.parametrize("command", ["compact_ledger", "run_pipeline"])
@pytest.mark.parametrize("seconds", ["-1", "0", "nan"])
def test_a_time_limit_that_is_not_positive_is_refused(command, seconds):
    args = ["orders"] if command == "run_pipeline" else []
    with pytest.raises(CommandError, match="--max-seconds must be more than 0") as refused:
        call_command(command, *args, "--max-seconds", seconds)
    assert refused.value.returncode == 1
