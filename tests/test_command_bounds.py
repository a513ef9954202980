"""Numbers a command cannot honour are refused (exit code 1), or for a watch's settle time are a usage error
(exit code 2), before it touches anything: no database access is allowed in these tests, so a command that
went on would fail here with pytest-django's "Database access not allowed"."""
import pytest
from django.core.management import CommandError, call_command

from tests.commands import run_command


@pytest.mark.parametrize("command", ["compact_ledger", "run_pipeline"])
@pytest.mark.parametrize("seconds", ["-1", "0", "nan"])
def test_a_time_limit_that_is_not_positive_is_refused(command, seconds):
    args = ["orders"] if command == "run_pipeline" else []
    with pytest.raises(CommandError, match="--max-seconds must be more than 0") as refused:
        call_command(command, *args, "--max-seconds", seconds)
    assert refused.value.returncode == 1


@pytest.mark.parametrize("argv", [["check", "team"], ["create", "team", "--group", "g", "--topic", "t"]])
@pytest.mark.parametrize("seconds", ["-3", str(7 * 24 * 3600 + 1), "99999999999999999999", "1.5", "soon"])
def test_a_watch_settle_time_out_of_range_or_not_a_number_is_a_usage_error(argv, seconds, capsys):
    code, _, err = run_command(capsys, "watch", *argv, "--settle-seconds", seconds)
    assert code == 2 and f"--settle-seconds: a whole number from 0 to 604800, got '{seconds}'" in err


def test_trace_takes_an_offset_or_a_key_not_both():
    with pytest.raises(CommandError, match="not both") as usage:
        call_command("trace", "orders", "--partition", "0", "--offset", "1", "--key", "k")
    assert usage.value.returncode == 2


@pytest.mark.parametrize("command", ["reconcile", "topic_check", "run_pipeline", "run_spark_pipeline", "trace",
                                     "compact_ledger", "check_alerts", "pipeline", "watch", "groups", "kafka",
                                     "rewind", "dead_letters", "alert_channel"])
def test_every_operator_command_names_its_exit_codes_in_its_help(command, capsys):
    with pytest.raises(SystemExit):
        call_command(command, "--help")
    assert "Exit codes: 0 " in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["list"], ["describe", "team-group"]])
def test_groups_refuses_an_unknown_cluster_before_asking_kafka(argv):
    with pytest.raises(CommandError, match="Refused: Kafka cluster 'nowhere': no such cluster") as refused:
        call_command("groups", *argv, "--cluster", "nowhere")
    assert refused.value.returncode == 1


@pytest.mark.parametrize("json", [[], ["--json"]])
def test_kafka_check_of_an_unknown_cluster_says_only_that_and_records_nothing(json, capsys):
    # It printed "Cluster nowhere: ? (?, authentication: ?)" first, and recorded a status for a cluster that is not.
    code, out, err = run_command(capsys, "kafka", "check", "nowhere", *json)
    assert (code, out) == (1, "")
    assert err.strip() == ("CommandError: Refused: Kafka cluster 'nowhere': no such cluster (configured: default; "
                           "more clusters come from the file TALLY_KAFKA_CLUSTERS names)")
