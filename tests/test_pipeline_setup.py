"""Adding pipelines without code: `pipeline create|list|show|delete` validate against the real broker and
database, refuse with a message that says what to do (exit 1), and change nothing when they refuse."""
import json

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine.transforms import Transform
from consumers.models import ActionLog, DeliveryMode, DesiredState, Pipeline
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import Invalid, PipelineSpec
from tests.commands import pipeline_command as run_command
from tests.db_roles import acting_as, execute_composed, new_role

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def _order(record):
    amount, currency = record.value.decode().split(" ")
    return ((int(amount), currency),)


# A user's own transform, referred to by its dotted path: tests.test_pipeline_setup.orders
orders = Transform("orders", (("amount_cents", "bigint"), ("currency", "text")), _order)


@pytest.fixture
def topic(make_topic):
    return make_topic("orders", partitions=2)


def execute(statement, params=None):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def unique_keys(table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass AND indisunique", [table])
        return cursor.fetchone()[0]


def test_create_with_create_table_adds_a_stopped_pipeline_its_group_and_a_keyed_sink(capsys, topic, table):
    code, out, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                                 "--create-table")
    assert (code, err) == (0, "")
    assert "Created pipeline orders" in out and "pipeline start orders" in out
    pipeline = Pipeline.objects.get(name="orders")
    assert (pipeline.group_id, pipeline.desired_state, pipeline.delivery_mode) == (
        "orders", DesiredState.STOPPED, DeliveryMode.EXACTLY_ONCE)
    assert unique_keys(table) == 1
    assert ActionLog.objects.get(pipeline=pipeline, action="create").actor == "cli"


def test_a_missing_topic_is_refused_with_exit_1_and_nothing_is_created(capsys, kafka_bootstrap, table):
    code, _, err = run_command(capsys, "create", "orders", "--topic", "no-such-topic", "--sink-table", table,
                               "--create-table")
    assert code == 1
    assert "topic: topic 'no-such-topic' does not exist in Kafka: create it first" in err
    assert not Pipeline.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [table])
        assert cursor.fetchone()[0] is None


def test_a_missing_table_is_refused_with_the_create_table_statement_that_works(capsys, topic, table):
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table)
    assert code == 1 and "pass --create-table" in err
    statement = err[err.index("CREATE TABLE"):].splitlines()[0]
    execute(statement)
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table)
    assert (code, err) == (0, "")


def test_an_existing_table_without_provenance_gets_the_exact_alter_table_statements(capsys, topic, table):
    execute(f'CREATE TABLE "{table}" (amount_cents bigint, currency text, note text)')
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "tests.test_pipeline_setup.orders")
    assert code == 1
    fixes = [line for line in err.splitlines() if line.startswith("ALTER TABLE")]
    assert fixes == [f'ALTER TABLE "{table}" ADD COLUMN "source_topic" text;',
                     f'ALTER TABLE "{table}" ADD COLUMN "source_partition" integer;',
                     f'ALTER TABLE "{table}" ADD COLUMN "source_offset" bigint;',
                     f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_provenance_key" UNIQUE '
                     f'("source_topic", "source_partition", "source_offset");']
    for statement in fixes:
        execute(statement)
    code, out, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                                 "--transform", "tests.test_pipeline_setup.orders")
    assert (code, err) == (0, "")
    assert Pipeline.objects.get(name="orders").transform == "tests.test_pipeline_setup.orders"


def test_at_least_once_needs_no_unique_key_but_exactly_once_does(topic, table):
    execute(f'CREATE TABLE "{table}" (id bigint, source_topic text, source_partition int, source_offset bigint)')
    pipeline_setup.validate(PipelineSpec("loose", topic, table, mode="at-least-once"))
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("strict", topic, table))
    assert "ADD CONSTRAINT" in refused.value.problems["sink_table"]


def test_an_unwritten_not_null_column_is_refused(topic, table):
    execute(f'CREATE TABLE "{table}" (id bigint, tenant text NOT NULL, source_topic text, source_partition int, '
            f'source_offset bigint, UNIQUE (source_topic, source_partition, source_offset))')
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("orders", topic, table))
    assert "columns tenant" in refused.value.problems["sink_table"]
    assert "give them a default" in refused.value.problems["sink_table"]


def test_a_user_without_privileges_on_the_sink_is_told_the_grant(topic, table):
    execute(f'CREATE TABLE "{table}" (id bigint, source_topic text, source_partition int, source_offset bigint, '
            f'UNIQUE (source_topic, source_partition, source_offset))')
    with new_role("limited") as role:
        execute_composed(sql.SQL("GRANT SELECT ON consumers_pipeline TO {}").format(role))
        with acting_as(role), pytest.raises(Invalid) as refused:
            pipeline_setup.validate(PipelineSpec("orders", topic, table))
    assert f'GRANT SELECT, INSERT, DELETE ON "{table}" TO "{role.string}";' in refused.value.problems["sink_table"]


def test_names_groups_transforms_and_reserved_tables_are_checked_together(topic, table):
    Pipeline.objects.create(name="taken", topic=topic, sink_table="x", group_id="shared")
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("taken", topic, "consumers_pipeline", group="shared",
                                             transform="nowhere.nothing", mode="twice"))
    problems = refused.value.problems
    assert set(problems) == {"name", "group", "transform", "mode", "sink_table"}
    assert "pipeline delete taken" in problems["name"]
    assert "used by pipeline 'taken'" in problems["group"]
    assert "Cannot import transform 'nowhere.nothing'" in problems["transform"]
    assert "exactly-once, at-least-once, at-most-once" in problems["mode"]
    assert "choose another name" in problems["sink_table"]


def test_isolation_level_and_log_truncation_policy_are_set_at_create_and_shown(capsys, topic, table):
    code, out, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                                 "--isolation-level", "read_uncommitted", "--on-log-truncated", "skip")
    assert (code, err) == (0, "")
    pipeline = Pipeline.objects.get(name="orders")
    assert (pipeline.isolation_level, pipeline.on_log_truncated) == ("read_uncommitted", "skip")
    assert ActionLog.objects.get(action="create").params["isolation_level"] == "read_uncommitted"
    code, out, _ = run_command(capsys, "show", "orders")
    assert "isolation_level:   read_uncommitted" in out and "on_log_truncated:  skip" in out
    code, out, _ = run_command(capsys, "list", "--json")
    (row,) = json.loads(out)
    assert (row["isolation_level"], row["on_log_truncated"]) == ("read_uncommitted", "skip")


def test_without_them_a_pipeline_reads_committed_records_and_stops_on_a_truncated_log(capsys, topic, table):
    code, out, _ = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                               "--json")
    assert code == 0
    assert (json.loads(out)["isolation_level"], json.loads(out)["on_log_truncated"]) == ("read_committed", "stop")


def test_an_unknown_isolation_level_or_truncation_policy_exits_1_and_creates_nothing(capsys, topic, table):
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                               "--isolation-level", "read_dirty", "--on-log-truncated", "ignore")
    assert code == 1
    assert "isolation_level: unknown isolation level 'read_dirty': use read_committed" in err
    assert "on_log_truncated: unknown policy 'ignore' for a log truncated past the stored position: use stop" in err
    assert not Pipeline.objects.exists()
    refusal = ActionLog.objects.get()   # nothing but the refusal, as every door writes it
    assert (refusal.action, refusal.actor, refusal.result) == ("create", "cli", "refused")
    assert refusal.params == {"via": "cli", "name": "orders"} and "isolation_level: unknown" in refusal.message
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [table])
        assert cursor.fetchone()[0] is None


def test_the_spark_engine_refuses_read_uncommitted(topic, table):
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("orders", topic, table, engine="spark", isolation_level="read_uncommitted",
                                             create_table=True))
    assert set(refused.value.problems) == {"isolation_level"}
    assert "use the python engine for read_uncommitted" in refused.value.problems["isolation_level"]


def test_usage_errors_exit_2(capsys, kafka_bootstrap):
    code, _, err = run_command(capsys, "create", "orders", "--sink-table", "t")
    assert code == 2 and "--topic" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", "t", "--sink-table", "t", "--mode", "twice")
    assert code == 2 and "invalid choice: 'twice'" in err
    assert not Pipeline.objects.exists()


def test_list_and_show_print_tables_and_json_and_an_unknown_name_exits_1(capsys, topic, table):
    pipeline_setup.create(PipelineSpec("orders", topic, table, mode="at-most-once", create_table=True))
    code, out, _ = run_command(capsys, "list")
    assert code == 0 and "orders" in out and "at-most-once" in out
    code, out, _ = run_command(capsys, "list", "--json")
    assert [row["name"] for row in json.loads(out)] == ["orders"]
    code, out, _ = run_command(capsys, "show", "orders", "--json")
    shown = json.loads(out)
    assert (shown["topic"], shown["sink_table"], shown["group"], shown["positions"]) == (topic, table, "orders", {})
    code, _, err = run_command(capsys, "show", "nosuch")
    assert code == 1 and "No pipeline named 'nosuch'" in err


def test_delete_is_refused_while_running_and_keeps_the_action_log(capsys, topic, table, monkeypatch):
    from consumers.operations import actions

    monkeypatch.setattr(actions, "enqueue_run", lambda *args, **kwargs: [])
    pipeline_setup.create(PipelineSpec("orders", topic, table, create_table=True))
    actions.start("orders")
    code, _, err = run_command(capsys, "delete", "orders")
    assert code == 1 and "pipeline stop orders" in err
    assert Pipeline.objects.filter(name="orders").exists()
    actions.stop("orders")
    code, out, _ = run_command(capsys, "delete", "orders")
    assert code == 0 and not Pipeline.objects.filter(name="orders").exists()
    history = ActionLog.objects.filter(params__pipeline="orders").order_by("created_at")
    assert list(history.values_list("action", flat=True)) == ["create", "start", "stop", "delete"]
    code, _, err = run_command(capsys, "delete", "orders")
    assert code == 1 and "No pipeline named 'orders'" in err


def test_a_stopped_pipeline_whose_killed_run_never_said_it_ended_can_be_deleted_once_its_lease_is_over(
        capsys, topic, table, monkeypatch, settings):
    # A SIGKILLed engine host (OOM) leaves its run's row "running"; only the supervisor of a running pipeline
    # declares such a run crashed. Once the pipeline is stopped, the dead run must not block the delete forever.
    from datetime import timedelta

    from django.utils import timezone

    from consumers.models import ConsumerRun, RunState
    from consumers.operations import actions

    monkeypatch.setattr(actions, "enqueue_run", lambda *args, **kwargs: [])
    pipeline = pipeline_setup.create(PipelineSpec("orders", topic, table, create_table=True))
    actions.start("orders")
    pipeline.refresh_from_db()
    run = ConsumerRun.objects.create(pipeline=pipeline, epoch=pipeline.epoch, host="worker-1", pid=4242,
                                     state=RunState.RUNNING, heartbeat_at=timezone.now())
    actions.stop("orders")
    code, _, err = run_command(capsys, "delete", "orders")
    assert code == 1 and "has live runs" in err          # still within its lease: it may be ending
    ConsumerRun.objects.filter(pk=run.pk).update(
        heartbeat_at=timezone.now() - timedelta(seconds=settings.TALLY_RUN_LEASE_SECONDS + 1))
    code, _, err = run_command(capsys, "delete", "orders")
    assert (code, err) == (0, "")
    assert not Pipeline.objects.filter(name="orders").exists()


def test_runs_are_stored_shown_and_refused_outside_their_bounds_or_for_spark(capsys, topic, table, settings):
    settings.TALLY_MAX_RUNS_PER_PIPELINE = 4
    for runs, expected in (("0", "runs must be between 1 and 4"), ("5", "runs must be between 1 and 4")):
        code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                                   "--create-table", "--runs", runs)
        assert code == 1 and expected in err
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("orders", topic, table, engine="spark", runs=2, create_table=True))
    assert "use runs = 1, or the python engine" in refused.value.problems["runs"]
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("orders", topic, table, runs=True, create_table=True))
    assert refused.value.problems["runs"] == "must be a whole number, got bool"
    assert not Pipeline.objects.exists()
    code, out, _ = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--create-table",
                               "--runs", "3", "--json")
    assert code == 0 and json.loads(out)["runs"] == 3
    assert Pipeline.objects.get(name="orders").parallel_runs == 3
    assert ActionLog.objects.get(action="create", result="done").params["runs"] == 3


def test_a_second_pipeline_of_the_same_topic_into_the_same_table_is_refused(topic, table):
    first = pipeline_setup.create(PipelineSpec("first", topic, table, create_table=True))
    with pytest.raises(Invalid) as refused:
        pipeline_setup.validate(PipelineSpec("second", topic, table))
    assert refused.value.problems["sink_table"].startswith(f"pipeline 'first' already writes topic {topic!r} into")
    pipeline_setup.validate(PipelineSpec("first", topic, table), existing=first)   # its own table stays its own
