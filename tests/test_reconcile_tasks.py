"""Reconciliation on Celery: the beat entries name registered tasks, and a real worker reconciles and samples
pipelines into this test's database."""
import pytest
from django.conf import settings
from django.db import connection

from consumers.engine import commit, db, sinks
from consumers.engine.transforms import SourceRecord, resolve
from consumers.models import LagSnapshot, PipelineHealth
from consumers.tasks.reconciliation import reconcile_all_task, take_lag_snapshots_task
from tests.producing import numbered, send


def test_the_beat_schedule_runs_reconciliation_snapshots_downsampling_compaction_and_retention():
    from tally.celery import app

    app.loader.import_default_modules()
    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"consumers.reconcile_all", "consumers.take_lag_snapshots", "consumers.downsample_lag_snapshots",
            "consumers.compact_ledger", "consumers.apply_retention", "tally.alerts.apply_retention"} <= tasks
    assert tasks <= set(app.tasks)


@pytest.mark.celery
@pytest.mark.kafka
def test_a_worker_reconciles_and_samples_every_pipeline(transactional_db, kafka_bootstrap, make_topic, celery_worker):
    from consumers.models import Pipeline

    topic = make_topic("rk-task")
    send(topic, numbered(40))
    pipeline = Pipeline.objects.create(name="rk-task", topic=topic, sink_table="rk_task_sink", epoch=1)
    with connection.cursor() as cur:
        sinks.ensure_sink_table(cur, pipeline.sink_table, resolve("int_value"), True)
    conn = db.connect()
    try:
        commit.ensure_positions(conn, pipeline.pk, {0: 0})
        commit.commit_batch(conn, commit.Target.for_pipeline(pipeline), 1,
                            {0: [SourceRecord(0, o, None, str(o + 1).encode()) for o in range(30)]})
    finally:
        conn.close()
    try:
        summary = reconcile_all_task.delay().get(timeout=60)
        assert summary == {"pipelines": 1, "not_exact": [], "statuses": {"rk-task": "OK"}}
        health = PipelineHealth.objects.get(pipeline=pipeline)
        assert (health.lag_records, health.lost, health.duplicated) == (10, 0, 0)
        assert take_lag_snapshots_task.delay().get(timeout=60)["rows"] >= 2
        assert LagSnapshot.objects.get(pipeline=pipeline, partition=0).lag_records == 10
    finally:
        with connection.cursor() as cur:
            sinks.drop_sink_table(cur, pipeline.sink_table)
