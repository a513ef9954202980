"""A pipeline whose sink breaks after it was created (table dropped, a column dropped, privileges
revoked) is ERR at the next reconciliation, with the reason, and the status rule alerts in the same
cycle; once the sink is repaired the reason goes away."""
import uuid

import pytest
from django.db import connection

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert, RuleKind
from consumers.engine import sink_checks
from consumers.engine.python import run_pipeline
from consumers.engine.transforms import resolve
from consumers.models import Pipeline, Status
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import PipelineSpec
from consumers.reconciliation import reconcile
from tests.conftest import drop_sink_tables
from tests.db_roles import acting_as, new_role
from tests.producing import numbered, send

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def consumed(make_topic):
    table = f"brk_{uuid.uuid4().hex[:8]}"
    topic = make_topic("breaks", partitions=2)
    send(topic, numbered(40, partitions=2, first=0))
    pipeline = pipeline_setup.create(PipelineSpec("breaks", topic, table, create_table=True))
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    ensure_default_rules()
    yield pipeline
    drop_sink_tables([table])


def execute(statement):
    with connection.cursor() as cursor:
        cursor.execute(statement)


def test_a_dropped_sink_is_err_with_its_reason_and_alerts_in_the_same_cycle(consumed):
    assert reconcile.reconcile_pipeline(consumed).status == Status.OK
    assert not Alert.objects.exists()
    execute(f'DROP TABLE "{consumed.sink_table}"')
    report = reconcile.reconcile_pipeline(consumed)
    assert report.status == Status.ERR and not report.exact
    assert report.sink_error == f"sink table '{consumed.sink_table}' does not exist"
    consumed.refresh_from_db()
    assert consumed.health.status == Status.ERR
    assert set(consumed.partition_health.values_list("status", flat=True)) == {Status.ERR}
    evaluate_all()
    alert = Alert.objects.get(pipeline=consumed, rule__kind=RuleKind.STATUS)
    assert "status ERR" in alert.summary and "does not exist" in alert.summary

    execute(f'CREATE TABLE "{consumed.sink_table}" (LIKE consumers_pipeline)')  # back, but the wrong shape
    report = reconcile.reconcile_pipeline(consumed)
    assert "lacks column(s) source_topic, source_partition, source_offset" in report.sink_error


def test_a_repaired_sink_clears_the_reason(consumed):
    execute(f'ALTER TABLE "{consumed.sink_table}" DROP CONSTRAINT IF EXISTS "{consumed.sink_table}_provenance_key"')
    execute(f'DROP INDEX IF EXISTS "{consumed.sink_table}_provenance_key"')
    report = reconcile.reconcile_pipeline(consumed)
    assert report.sink_error.endswith("has no unique key on the provenance columns")
    assert Pipeline.objects.get(pk=consumed.pk).last_error.startswith("sink: ")
    execute(f'CREATE UNIQUE INDEX ON "{consumed.sink_table}" (source_topic, source_partition, source_offset)')
    report = reconcile.reconcile_pipeline(consumed)
    assert (report.sink_error, report.status) == ("", Status.OK)
    assert Pipeline.objects.get(pk=consumed.pk).last_error == ""


def test_revoked_privileges_are_a_sink_problem(consumed):
    with new_role("revoked") as role, acting_as(role), connection.cursor() as cursor:
        problem = sink_checks.problem(cursor.cursor, consumed.sink_table, resolve("int_value"), True)
    assert problem == f"the database user may not select, insert and delete in sink table '{consumed.sink_table}'"
