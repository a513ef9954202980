"""An alert pass reads what the rules need for all pipelines and watches in a few queries: its query count does
not grow with their number, and the views it builds in bulk make the rules find what one pipeline's own view
finds."""
from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext

from alerts.evaluate import evaluate_all
from alerts.models import AlertRule, RuleKind
from alerts.rules import PipelineView, WatchView, check
from consumers.models import (
    ActionLog,
    ActionResult,
    ConsumerRun,
    DeadLetter,
    PartitionHealth,
    Pipeline,
    PipelineHealth,
    RunState,
    Status,
    Watch,
    WatchPartition,
    WatchRange,
)
from tests.alert_clock import NOW, default_rules, frozen_clock  # noqa: F401 - autouse fixtures


def healthy_pipeline(i: int, running: bool = True) -> Pipeline:
    """A pipeline as reconciliation leaves a healthy one: health rows, a live run, nothing firing."""
    pipeline = Pipeline.objects.create(name=f"pass-{i}", topic=f"pass-{i}", sink_table=f"pass_{i}",
                                       desired_state="running" if running else "stopped")
    PipelineHealth.objects.create(pipeline=pipeline, status=Status.OK, checked_at=NOW, lag_records=0)
    for partition in (0, 1):
        PartitionHealth.objects.create(pipeline=pipeline, partition=partition, status=Status.OK, next_offset=10,
                                       high_watermark=10, lag_records=0, lag_seconds=0.0)
    if running:
        ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="w1", pid=i, state=RunState.RUNNING,
                                   heartbeat_at=NOW - timedelta(seconds=1))
    return pipeline


def healthy_watch(i: int) -> Watch:
    watch = Watch.objects.create(name=f"pass-w{i}", group_id=f"team-{i}", topic=f"team-{i}", checked_at=NOW,
                                 lag_records=0)
    WatchPartition.objects.create(watch=watch, partition=0, start_offset=0, settled_offset=10, committed=10,
                                  high_watermark=10)
    WatchRange.objects.create(watch=watch, partition=0, start=0, end=10, records=10)
    return watch


def pass_queries() -> int:
    with CaptureQueriesContext(connection) as queries:
        report = evaluate_all()
    assert not report.errors and not report.firing
    return len(queries)


def test_the_query_count_of_an_alert_pass_does_not_grow_with_pipelines_and_watches():
    for i in range(2):
        healthy_pipeline(i)
        healthy_watch(i)
    few = pass_queries()
    for i in range(2, 12):
        healthy_pipeline(i, running=i % 2 == 0)
        healthy_watch(i)
    assert pass_queries() == few


def test_rules_find_the_same_in_the_pass_views_as_in_one_pipelines_own_view(settings):
    settings.TALLY_RUN_LEASE_SECONDS = 30
    quiet, lettered, stopped_run = healthy_pipeline(0), healthy_pipeline(1), healthy_pipeline(2)
    ConsumerRun.objects.filter(pipeline=stopped_run).update(state=RunState.CRASHED)
    for offset, age in ((1, 10), (2, 20), (3, 30), (4, 400)):
        DeadLetter.objects.create(pipeline=lettered, partition=0, offset=offset, error="bad",
                                  created_at=NOW - timedelta(seconds=age))
    PartitionHealth.objects.filter(pipeline=quiet, partition=1).update(
        lost=3, findings=[{"kind": "lost", "start": 4, "end": 7, "count": 3, "scope": "verified"}])
    ActionLog.objects.create(pipeline=quiet, action="rewind", actor="op", result=ActionResult.DONE, created_at=NOW,
                             offsets_before={"0": 10}, offsets_after={"0": 2})
    rules = [AlertRule(name="letters", kind=RuleKind.DEAD_LETTERS, threshold=2, interval_seconds=60),
             AlertRule(name="letters-long", kind=RuleKind.DEAD_LETTERS, threshold=3, interval_seconds=600),
             AlertRule(name="consumer", kind=RuleKind.NO_CONSUMER), AlertRule(name="lost", kind=RuleKind.LOST),
             AlertRule(name="status", kind=RuleKind.STATUS, statuses="STALL,ERR")]
    pipelines = [quiet, lettered, stopped_run]
    views = PipelineView.load_all(pipelines, NOW, rules)
    found = {}
    for pipeline in pipelines:
        for rule in rules:
            alone = check(rule, PipelineView.load(pipeline, NOW))
            in_pass = check(rule, views[pipeline.pk])
            assert (in_pass and in_pass.summary) == (alone and alone.summary), (pipeline.name, rule.name)
            found[(pipeline.name, rule.name)] = alone and alone.summary
    assert found[("pass-1", "letters")] == "3 dead letters in 60 s > 2"
    assert found[("pass-1", "letters-long")] == "4 dead letters in 600 s > 3"
    assert found[("pass-2", "consumer")].startswith("should run but has no live consumer")
    assert found[("pass-0", "lost")] == "3 lost records (partition 1: offsets 4-6)"
    assert views[quiet.pk].rewinds.latest_at == NOW


def test_a_watch_finding_reads_the_same_in_the_pass_views():
    watch = healthy_watch(0)
    WatchRange.objects.create(watch=watch, partition=0, start=10, end=20, records=10, lost=2, lost_offsets=[12, 13])
    rule = AlertRule(name="lost", kind=RuleKind.LOST)
    alone = check(rule, WatchView.load(watch, NOW))
    assert alone is not None
    assert check(rule, WatchView.load_all([watch], NOW)[watch.pk]).summary == alone.summary
