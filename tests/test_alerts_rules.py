"""Rule conditions read from what reconciliation stored (PipelineHealth / PartitionHealth), with injected time."""
from datetime import timedelta

import pytest

from alerts.evaluate import evaluate_all
from alerts.models import Alert, AlertRule, AlertState, Notification, RuleKind
from alerts.rules import PipelineView, check, rules_for
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
)
from tests.alert_clock import NOW, default_rules, frozen_clock  # noqa: F401 - autouse fixtures


@pytest.fixture
def pipeline(db):
    return Pipeline.objects.create(name="nums", topic="nums", sink_table="nums_sink", desired_state="running")


def rule(kind, **fields):
    return AlertRule(name=kind, kind=kind, **fields)


def health(pipeline, status=Status.OK, **fields):
    PipelineHealth.objects.update_or_create(pipeline=pipeline, defaults={"status": status, "checked_at": NOW})
    return PartitionHealth.objects.update_or_create(
        pipeline=pipeline, partition=fields.pop("partition", 0), defaults={"status": status, **fields})[0]


def fires(kind, pipeline, now=NOW, **rule_fields):
    finding = check(rule(kind, **rule_fields), PipelineView.load(pipeline, now))
    return finding.summary if finding else None


def test_lag_in_records_fires_only_above_the_threshold(pipeline):
    health(pipeline, lag_records=500, next_offset=100, high_watermark=600)
    assert fires(RuleKind.LAG_RECORDS, pipeline, threshold=499) == "lag 500 records > 499"
    assert fires(RuleKind.LAG_RECORDS, pipeline, threshold=500) is None


def test_lag_in_records_does_not_count_a_rewound_range_being_replayed(pipeline):
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="bob", result=ActionResult.DONE,
                             offsets_before={"0": 1000}, offsets_after={"0": 0}, created_at=NOW - timedelta(hours=1))
    health(pipeline, lag_records=1100, next_offset=200, high_watermark=1300)
    assert fires(RuleKind.LAG_RECORDS, pipeline, threshold=299) == "lag 300 records > 299"
    assert fires(RuleKind.LAG_RECORDS, pipeline, threshold=300) is None


def rewound(pipeline, before, after, hours_ago):
    ActionLog.objects.create(pipeline=pipeline, action="rewind", actor="bob", result=ActionResult.DONE,
                             offsets_before={"0": before}, offsets_after={"0": after},
                             created_at=NOW - timedelta(hours=hours_ago))


def test_a_loss_in_a_range_a_rewind_back_replays_fires_once_the_replay_is_past_it(pipeline):
    rewound(pipeline, 20, 60, hours_ago=3)   # skipped 20..59 on purpose
    rewound(pipeline, 70, 0, hours_ago=2)    # then everything read again
    findings = [{"kind": "lost", "start": 30, "end": 35, "count": 5}]
    health(pipeline, findings=findings, lost=5, next_offset=50, high_watermark=70)
    assert fires(RuleKind.LOST, pipeline) is None                 # still being replayed: planned
    health(pipeline, findings=findings, lost=5, next_offset=70, high_watermark=70)
    assert fires(RuleKind.LOST, pipeline) == "5 lost records (partition 0: offsets 30-34)"


def test_a_range_skipped_forward_stays_planned_until_a_rewind_reads_it_again(pipeline):
    rewound(pipeline, 20, 60, hours_ago=3)
    health(pipeline, findings=[{"kind": "lost", "start": 20, "end": 60, "count": 40}], lost=40, next_offset=70,
           high_watermark=70)
    assert fires(RuleKind.LOST, pipeline) is None
    rewound(pipeline, 70, 40, hours_ago=1)   # back into the skipped range: 40..59 are read again, 20..39 not
    assert fires(RuleKind.LOST, pipeline) == "20 lost records (partition 0: offsets 40-59)"


def test_lag_in_seconds_uses_the_worst_partition(pipeline):
    health(pipeline, partition=0, lag_seconds=10.0)
    health(pipeline, partition=1, lag_seconds=95.4)
    assert fires(RuleKind.LAG_SECONDS, pipeline, threshold=60) == "lag 95 s > 60 s"
    assert fires(RuleKind.LAG_SECONDS, pipeline, threshold=120) is None


@pytest.mark.parametrize("kind,finding_kind,one,several", [
    (RuleKind.LOST, "lost", "lost record", "lost records"),
    (RuleKind.DUPLICATED, "duplicated", "duplicated record", "duplicated records"),
    (RuleKind.PHANTOM, "phantom", "phantom row", "phantom rows"),
    (RuleKind.GAP, "gap", "offset in a ledger gap", "offsets in ledger gaps"),
])
def test_each_kind_of_finding_fires_its_own_rule_with_offsets(pipeline, kind, finding_kind, one, several):
    health(pipeline, findings=[{"kind": finding_kind, "start": 20, "end": 23, "count": 3}])
    assert fires(kind, pipeline) == f"3 {several} (partition 0: offsets 20-22)"
    other = RuleKind.PHANTOM if kind != RuleKind.PHANTOM else RuleKind.LOST
    assert fires(other, pipeline) is None
    health(pipeline, findings=[{"kind": finding_kind, "start": 20, "end": 21, "count": 1}])
    assert fires(kind, pipeline) == f"1 {one} (partition 0: offsets 20)"   # one is said in the singular


def test_a_count_without_findings_still_fires(pipeline):
    health(pipeline, lost=4)
    assert fires(RuleKind.LOST, pipeline) == "4 lost records (partition 0)"


@pytest.mark.parametrize("status,fired", [(Status.OK, False), (Status.WARN, False), (Status.ERR, True),
                                          (Status.STALL, True), (Status.STOP, True)])
def test_status_rule_fires_on_stall_stop_and_err(pipeline, status, fired):
    health(pipeline, status=status)
    assert (fires(RuleKind.STATUS, pipeline) is not None) is fired


def test_a_stall_of_a_paused_pipeline_is_planned_but_err_still_fires(pipeline):
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state="paused")
    pipeline.refresh_from_db()
    health(pipeline, status=Status.STALL)
    assert fires(RuleKind.STATUS, pipeline) is None
    health(pipeline, status=Status.ERR)
    assert fires(RuleKind.STATUS, pipeline) == "status ERR (partitions 0)"


def test_dead_letters_fire_above_n_within_the_interval_only(pipeline):
    for offset, age in ((1, 10), (2, 20), (3, 30), (4, 400)):
        DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=offset, error="bad",
                                  created_at=NOW - timedelta(seconds=age))
    assert fires(RuleKind.DEAD_LETTERS, pipeline, threshold=2, interval_seconds=60) == "3 dead letters in 60 s > 2"
    assert fires(RuleKind.DEAD_LETTERS, pipeline, threshold=3, interval_seconds=60) is None
    assert fires(RuleKind.DEAD_LETTERS, pipeline, threshold=3, interval_seconds=600) is not None
    assert fires(RuleKind.DEAD_LETTERS, pipeline, threshold=0, interval_seconds=15) == "1 dead letter in 15 s > 0"


def test_a_pipeline_that_should_run_without_a_live_heartbeat_fires(pipeline, settings):
    settings.TALLY_RUN_LEASE_SECONDS = 30
    assert fires(RuleKind.NO_CONSUMER, pipeline) == "should run but has no live consumer (never started)"
    run = ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="w1", pid=7, state=RunState.RUNNING,
                                     heartbeat_at=NOW - timedelta(seconds=10))
    assert fires(RuleKind.NO_CONSUMER, pipeline) is None
    assert fires(RuleKind.NO_CONSUMER, pipeline, now=NOW + timedelta(seconds=21)).startswith(
        "should run but has no live consumer (last heartbeat")
    ConsumerRun.objects.filter(pk=run.pk).update(state=RunState.CRASHED, heartbeat_at=NOW)
    assert fires(RuleKind.NO_CONSUMER, pipeline) is not None


def test_a_pipeline_whose_run_task_waits_in_the_queue_says_it_waits_for_a_worker(pipeline, settings):
    settings.TALLY_WORKER_WAIT_SECONDS = 30
    Pipeline.objects.filter(pk=pipeline.pk).update(runs_waiting=2, waiting_since=NOW - timedelta(seconds=40))
    pipeline.refresh_from_db()
    assert fires(RuleKind.NO_CONSUMER, pipeline) == ("should run but is waiting for a worker: 2 run task(s) queued "
                                                     f"since {NOW - timedelta(seconds=40):%Y-%m-%d %H:%M:%S} UTC; "
                                                     "add a worker")


def test_a_stopped_pipeline_needs_no_consumer(pipeline):
    Pipeline.objects.filter(pk=pipeline.pk).update(desired_state="stopped")
    pipeline.refresh_from_db()
    assert fires(RuleKind.NO_CONSUMER, pipeline) is None


def test_a_pipelines_own_rule_replaces_the_global_rule_of_its_kind(pipeline):
    other = Pipeline.objects.create(name="other", topic="o", sink_table="o_sink")
    AlertRule.objects.all().delete()
    global_lag = AlertRule.objects.create(name="lag", kind=RuleKind.LAG_RECORDS, threshold=1000)
    global_lost = AlertRule.objects.create(name="lost", kind=RuleKind.LOST)
    own_lag = AlertRule.objects.create(name="nums lag", kind=RuleKind.LAG_RECORDS, threshold=10, pipeline=pipeline)
    own_lost_off = AlertRule.objects.create(name="nums lost off", kind=RuleKind.LOST, pipeline=pipeline, enabled=False)
    rules = list(AlertRule.objects.all())
    assert set(rules_for(pipeline, rules)) == {own_lag}
    assert set(rules_for(other, rules)) == {global_lag, global_lost}
    assert own_lost_off not in rules_for(other, rules)


def test_disabling_a_rule_resolves_its_open_alert(pipeline, settings):
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]
    health(pipeline, findings=[{"kind": "lost", "start": 0, "end": 1, "count": 1}])
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="w1", pid=7, state=RunState.RUNNING, heartbeat_at=NOW)
    evaluate_all(now=NOW)
    alert = Alert.objects.get(pipeline=pipeline)
    AlertRule.objects.filter(pk=alert.rule_id).update(enabled=False)

    report = evaluate_all(now=NOW + timedelta(seconds=5))

    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and report.resolved == [f"nums/{alert.rule.name}"]
    assert sorted(Notification.objects.values_list("kind", flat=True)) == ["fired", "resolved"]


def test_a_rule_check_that_fails_is_reported_and_does_not_stop_the_others(pipeline, monkeypatch):
    from alerts import rules as rules_module

    def broken(rule, view):
        raise RuntimeError("boom")

    monkeypatch.setitem(rules_module.CHECKS, RuleKind.DUPLICATED, broken)
    health(pipeline, findings=[{"kind": "lost", "start": 0, "end": 2, "count": 2}])

    report = evaluate_all(now=NOW)

    assert [e["error"] for e in report.errors] == ["boom"]
    lost = [a["summary"] for a in report.firing if "lost" in a["summary"]]
    assert lost == ["2 lost records (partition 0: offsets 0-1)"]


def test_a_pipeline_that_cannot_be_read_keeps_its_open_alerts_open(pipeline, settings, monkeypatch):
    settings.ALERT_RECIPIENTS = ["oncall@example.com"]
    health(pipeline, findings=[{"kind": "lost", "start": 0, "end": 1, "count": 1}])
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="w1", pid=7, state=RunState.RUNNING, heartbeat_at=NOW)
    evaluate_all(now=NOW)

    def unreadable(cls, *args, **kwargs):
        raise RuntimeError("canceling statement due to statement timeout")

    monkeypatch.setattr(PipelineView, "load_all", classmethod(unreadable))
    monkeypatch.setattr(PipelineView, "load", classmethod(unreadable))
    report = evaluate_all(now=NOW + timedelta(seconds=30))

    assert [e["error"] for e in report.errors] == ["canceling statement due to statement timeout"]
    assert report.resolved == [] and Alert.objects.get(pipeline=pipeline).state == AlertState.FIRING
    assert list(Notification.objects.values_list("kind", flat=True)) == ["fired"]   # no "resolved" email


def test_err_caused_by_lost_records_is_left_to_the_loss_rule_so_one_incident_sends_one_email(pipeline):
    health(pipeline, status=Status.ERR, findings=[{"kind": "lost", "start": 3, "end": 4, "count": 1}])
    assert fires(RuleKind.STATUS, pipeline) is None
    assert fires(RuleKind.LOST, pipeline) == "1 lost record (partition 0: offsets 3)"
    health(pipeline, status=Status.ERR, findings=[])  # e.g. Kafka could not be read
    assert fires(RuleKind.STATUS, pipeline) == "status ERR (partitions 0)"


def test_folded_findings_are_named_as_a_covering_range_with_their_true_count(pipeline):
    health(pipeline, findings=[{"kind": "lost", "start": 1, "end": 2, "count": 1},
                               {"kind": "lost", "start": 10, "end": 90, "count": 7, "folded": 7}])
    assert fires(RuleKind.LOST, pipeline) == "8 lost records (partition 0: offsets 1, within 10-89)"


def test_unrecoverable_records_count_as_lost(pipeline):
    health(pipeline, findings=[{"kind": "unrecoverable", "start": 0, "end": 5, "count": 5}])
    assert fires(RuleKind.LOST, pipeline) == "5 lost records (partition 0: offsets 0-4)"


def test_duplicates_inside_a_ledger_overlap_are_counted_once_as_reconciliation_counts_them(pipeline):
    # At-least-once replayed offsets 20-39: the ledger overlaps there and each of the 20 rows is there twice.
    health(pipeline, duplicated=20, findings=[{"kind": "overlap", "start": 20, "end": 40, "count": 20},
                                              {"kind": "duplicated", "start": 20, "end": 40, "count": 20}])
    assert fires(RuleKind.DUPLICATED, pipeline) == "20 duplicated records (partition 0: offsets 20-39)"


def test_a_ledger_overlap_without_duplicated_rows_still_fires_the_duplicated_rule(pipeline):
    health(pipeline, findings=[{"kind": "overlap", "start": 60, "end": 65, "count": 5}])
    assert fires(RuleKind.DUPLICATED, pipeline) == (
        "5 offsets in overlapping ledger batches (partition 0: offsets 60-64)")
