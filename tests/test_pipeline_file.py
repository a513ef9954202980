"""`pipeline apply pipelines.toml`: every pipeline validated before anything changes, applied in one
transaction, idempotent, with a dry run that prints the plan and changes nothing."""
import uuid

import pytest

from consumers.models import ActionLog, Pipeline
from consumers.operations import actions
from tests.commands import pipeline_command as run_command
from tests.conftest import drop_sink_tables

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def names(make_topic):
    suffix = uuid.uuid4().hex[:6]
    tables = {"orders": f"orders_{suffix}", "clicks": f"clicks_{suffix}"}
    yield {"topic": make_topic("orders"), "other_topic": make_topic("clicks"), **tables}
    drop_sink_tables(tables.values())


def write(tmp_path, text):
    path = tmp_path / "pipelines.toml"
    path.write_text(text)
    return str(path)


def two_pipelines(names, transform="int_value"):
    return f"""
[pipelines.orders]
topic = "{names['topic']}"
sink_table = "{names['orders']}"
transform = "{transform}"
create_table = true

[pipelines.clicks]
topic = "{names['other_topic']}"
sink_table = "{names['clicks']}"
mode = "at-least-once"
group = "clicks-group"
create_table = true
"""


def test_apply_creates_then_changes_nothing_the_second_time(capsys, tmp_path, names):
    path = write(tmp_path, two_pipelines(names))
    code, out, err = run_command(capsys, "apply", path)
    assert (code, err) == (0, "")
    assert f"create orders: {names['topic']} -> {names['orders']} (exactly-once, transform int_value)" in out
    assert out.rstrip().endswith("created 2, updated 0, 0 unchanged.") and "to create" not in out
    assert Pipeline.objects.get(name="clicks").group_id == "clicks-group"
    code, out, _ = run_command(capsys, "apply", path)
    assert code == 0 and "unchanged orders" in out and "created 0, updated 0, 2 unchanged." in out
    assert ActionLog.objects.filter(action="create").count() == 2


def test_dry_run_prints_the_plan_and_changes_nothing(capsys, tmp_path, names):
    code, out, _ = run_command(capsys, "apply", write(tmp_path, two_pipelines(names)), "--dry-run")
    assert code == 0 and "create clicks" in out and out.rstrip().endswith(
        "Dry run: nothing changed. 2 to create, 0 to change, 0 unchanged.")
    assert not Pipeline.objects.exists()


def test_a_stopped_pipeline_takes_a_new_transform_and_a_running_one_is_refused(capsys, tmp_path, names, monkeypatch):
    monkeypatch.setattr(actions, "enqueue_run", lambda *args, **kwargs: [])
    run_command(capsys, "apply", write(tmp_path, two_pipelines(names)))
    changed = write(tmp_path, two_pipelines(names, transform="csv_ints").replace("create_table = true", ""))
    actions.start("orders")
    code, _, err = run_command(capsys, "apply", changed)
    assert code == 1 and "orders.name: pipeline 'orders' is running: stop it before changing it" in err
    assert Pipeline.objects.get(name="orders").transform == "int_value"
    actions.stop("orders")
    code, _, err = run_command(capsys, "apply", changed)
    # csv_ints writes a source_row column the table lacks: the exact fix is printed, nothing changes.
    assert code == 1 and f'ALTER TABLE "{names["orders"]}" ADD COLUMN "source_row" integer NOT NULL DEFAULT 0;' in err
    assert Pipeline.objects.get(name="orders").transform == "int_value"


def test_isolation_level_and_truncation_policy_are_created_diffed_and_changed_while_stopped(capsys, tmp_path, names,
                                                                                           monkeypatch):
    monkeypatch.setattr(actions, "enqueue_run", lambda *args, **kwargs: [])
    reading = two_pipelines(names).replace('transform = "int_value"\n',
                                           'transform = "int_value"\nisolation_level = "read_uncommitted"\n', 1)
    code, out, err = run_command(capsys, "apply", write(tmp_path, reading))
    assert (code, err) == (0, "")
    assert (f"create orders: {names['topic']} -> {names['orders']} (exactly-once, transform int_value, "
            f"isolation_level read_uncommitted)") in out
    orders = Pipeline.objects.get(name="orders")
    assert (orders.isolation_level, orders.on_log_truncated) == ("read_uncommitted", "stop")
    code, out, _ = run_command(capsys, "apply", write(tmp_path, reading))
    assert code == 0 and "created 0, updated 0, 2 unchanged." in out

    skipping = reading.replace('isolation_level = "read_uncommitted"\n', 'on_log_truncated = "skip"\n')
    actions.start("orders")
    code, _, err = run_command(capsys, "apply", write(tmp_path, skipping))
    assert code == 1 and "orders.name: pipeline 'orders' is running: stop it before changing it" in err
    assert Pipeline.objects.get(name="orders").on_log_truncated == "stop"
    actions.stop("orders")
    code, out, err = run_command(capsys, "apply", write(tmp_path, skipping), "--dry-run")
    assert code == 0 and "update orders: isolation_level read_uncommitted -> read_committed, on_log_truncated " \
                         "stop -> skip" in out
    assert Pipeline.objects.get(name="orders").on_log_truncated == "stop"
    code, out, err = run_command(capsys, "apply", write(tmp_path, skipping))
    assert (code, err) == (0, "") and out.rstrip().endswith("created 0, updated 1, 1 unchanged.")
    orders = Pipeline.objects.get(name="orders")
    assert (orders.isolation_level, orders.on_log_truncated) == ("read_committed", "skip")
    change = ActionLog.objects.get(pipeline=orders, action="update")
    assert change.params["on_log_truncated"] == {"from": "stop", "to": "skip"}


def test_an_unknown_isolation_level_or_truncation_policy_refuses_the_file(capsys, tmp_path, names):
    run_command(capsys, "apply", write(tmp_path, two_pipelines(names)))
    text = two_pipelines(names).replace('mode = "at-least-once"\n',
                                        'mode = "at-least-once"\nisolation_level = "dirty"\non_log_truncated = 1\n')
    code, _, err = run_command(capsys, "apply", write(tmp_path, text))
    assert code == 1 and "nothing was changed" in err
    assert "clicks.isolation_level: unknown isolation level 'dirty': use read_committed" in err
    assert "clicks.on_log_truncated: must be text, got int" in err
    clicks = Pipeline.objects.get(name="clicks")
    assert (clicks.isolation_level, clicks.on_log_truncated) == ("read_committed", "stop")
    assert not ActionLog.objects.filter(action="update").exists()


def test_a_topic_or_table_that_is_not_text_is_named_as_such_not_as_missing(capsys, tmp_path, names):
    text = two_pipelines(names).replace(f'topic = "{names["topic"]}"', "topic = 42").replace(
        f'sink_table = "{names["clicks"]}"', "sink_table = [1]")
    code, _, err = run_command(capsys, "apply", write(tmp_path, text))
    assert code == 1 and "nothing was changed" in err
    assert "orders.topic: must be text, got int" in err and "clicks.sink_table: must be text, got list" in err
    assert "required" not in err and not Pipeline.objects.exists()


def test_fields_that_own_the_history_cannot_change(capsys, tmp_path, names):
    run_command(capsys, "apply", write(tmp_path, two_pipelines(names)))
    moved = two_pipelines(names).replace(f'topic = "{names["topic"]}"', f'topic = "{names["other_topic"]}"')
    code, _, err = run_command(capsys, "apply", write(tmp_path, moved))
    assert code == 1 and "topic cannot change" in err and "delete it and create it again" in err
    assert Pipeline.objects.get(name="orders").topic == names["topic"]


def test_one_bad_pipeline_refuses_the_whole_file(capsys, tmp_path, names):
    text = two_pipelines(names).replace(f'topic = "{names["other_topic"]}"', 'topic = "missing-topic"')
    text += '\n[pipelines.extra]\ntopic = "x"\nsink_table = "y"\nretries = 3\n'
    code, _, err = run_command(capsys, "apply", write(tmp_path, text))
    assert code == 1 and "nothing was changed" in err
    assert "clicks.topic: topic 'missing-topic' does not exist" in err
    assert "extra.retries: unknown setting 'retries'" in err
    assert not Pipeline.objects.exists()


def test_unreadable_or_malformed_files_exit_1(capsys, tmp_path, kafka_bootstrap):
    code, _, err = run_command(capsys, "apply", str(tmp_path / "absent.toml"))
    assert code == 1 and "cannot read" in err
    code, _, err = run_command(capsys, "apply", write(tmp_path, "[pipelines.orders\n"))
    assert code == 1 and "is not valid TOML" in err
    not_utf8 = tmp_path / "latin1.toml"
    not_utf8.write_bytes(b"\xff\xfe[pipelines]\n")
    code, _, err = run_command(capsys, "apply", str(not_utf8))
    assert code == 1 and "is not valid TOML: it is not UTF-8 text" in err
    code, _, err = run_command(capsys, "apply", write(tmp_path, "[orders]\ntopic = 'x'\n"))
    assert code == 1 and "declare each pipeline as a [pipelines.NAME] table" in err
