"""A declaration file (`pipeline apply`, `watch apply`, TALLY_KAFKA_CLUSTERS) that TOML reads but Tally could never
store or that nests past the parser's depth is refused (exit 1, audited) before anything reads the database with
it: a NUL in a name or setting reached a query (a traceback), and deep nesting was a RecursionError."""
import pytest
from django.core.management import CommandError, call_command

from consumers.models import ActionLog, ActionResult, Pipeline
from tests.commands import run_command

pytestmark = pytest.mark.django_db(transaction=True)   # run_command closes connections, as a command does
NESTED = "[" * 600 + "]" * 600


@pytest.mark.parametrize("command, text, said", [
    ("pipeline", f'[pipelines.orders]\ntopic = {NESTED}\n', "it nests too deeply"),
    ("watch", f'[watches.orders]\ntopic = {NESTED}\n', "it nests too deeply"),
    ("pipeline", '[pipelines."orders\\u0000x"]\ntopic = "t"\nsink_table = "s"\n', "holds a NUL character"),
    ("pipeline", '[pipelines.orders]\ntopic = "t"\nsink_table = "s"\ngroup = "g\\u0000"\n',
     "pipelines.orders.group holds a NUL character"),
    ("pipeline", '[pipelines.orders]\ntopic = "t"\nsink_table = "s"\ncluster = "c\\u0000"\n',
     "pipelines.orders.cluster holds a NUL character"),
    ("pipeline", '[pipelines.orders]\ntopic = "t"\nsink_table = "s"\nupsert_key = ["k", "\\u0000"]\n',
     "pipelines.orders.upsert_key.1 holds a NUL character"),
])
def test_a_file_no_column_could_store_or_too_deep_is_refused_and_audited(capsys, tmp_path, command, text, said):
    path = tmp_path / "declared.toml"
    path.write_text(text)
    code, out, err = run_command(capsys, command, "apply", str(path))
    assert code == 1 and "Refused:" in err and said in err and "Traceback" not in err
    assert not Pipeline.objects.exists()
    assert ActionLog.objects.filter(result=ActionResult.REFUSED).count() == 1


def test_a_clusters_file_nested_too_deeply_is_refused(tmp_path, settings):
    path = tmp_path / "clusters.toml"
    path.write_text(f"[clusters.prod]\nbootstrap_servers = {NESTED}\n")
    settings.TALLY_KAFKA_CLUSTERS = str(path)
    with pytest.raises(CommandError, match="it nests too deeply") as refused:
        call_command("kafka", "clusters")
    assert refused.value.returncode == 1


@pytest.mark.parametrize("option, value", [("--partitions", str(2**31)), ("--records", str(10**9)),
                                           ("--partitions", "0")])
def test_seed_demo_refuses_a_size_no_demo_needs_before_it_asks_kafka(option, value):
    with pytest.raises(CommandError, match="records must be from 1 to") as refused:
        call_command("seed_demo", option, value)
    assert refused.value.returncode == 1
