"""docs/monitoring/: every metric (and every label a selector names) in the Prometheus rules and the Grafana
dashboard is one /metrics really exports, so renaming a metric fails here until the kit follows; and the
rules cover what the kit promises (lag, lag in seconds, lost, duplicated, stalled, run down, dead letters)."""
import json
import re
from pathlib import Path

import pytest
import yaml
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from consumers.models import ConsumerRun, DeadLetter, LagSnapshot, PartitionHealth, Pipeline, PipelineHealth
from dashboard.metrics import render_metrics

KIT = Path(__file__).resolve().parent.parent / "docs" / "monitoring"
# A metric name followed by an optional {selector}.
SELECTOR = re.compile(r"\b(tally_[a-z0-9_]+)\b(?:\{([^}]*)\})?")
LABEL = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def rule_expressions() -> dict[str, str]:
    rules = yaml.safe_load((KIT / "tally-alerts.rules.yml").read_text())
    return {rule["alert"]: rule["expr"] for group in rules["groups"] for rule in group["rules"]}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((KIT / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [var["definition"] for var in dashboard["templating"]["list"] if var.get("definition")]
    return exprs


def used(expressions) -> dict[str, set[str]]:
    """Metric name -> the label names its selectors use."""
    found: dict[str, set[str]] = {}
    for expr in expressions:
        for name, selector in SELECTOR.findall(expr):
            found.setdefault(name, set()).update(LABEL.findall(selector or ""))
    return found


def unknown(usage: dict[str, set[str]], exported: dict[str, set[str]]) -> list[str]:
    problems = [f"{name}: not exported" for name in usage if name not in exported]
    problems += [f"{name}: no label {label}" for name, labels in usage.items() if name in exported
                 for label in labels - exported[name]]
    return problems


@pytest.fixture
def exported(db) -> dict[str, set[str]]:
    """The families /metrics serves, with their label names, for a pipeline that has every kind of data."""
    now = timezone.now()
    pipeline = Pipeline.objects.create(name="orders", topic="orders", sink_table="orders", desired_state="running")
    PipelineHealth.objects.create(pipeline=pipeline, status="OK", checked_at=now, lag_records=5, lag_seconds=2.0,
                                  records_per_second=10.0)
    PartitionHealth.objects.create(pipeline=pipeline, partition=0, status="OK", checked_at=now, lag_records=5,
                                   lag_seconds=2.0, high_watermark=10, log_start=0, next_offset=5,
                                   kafka_committed=5)
    ConsumerRun.objects.create(pipeline=pipeline, epoch=1, host="h", pid=1, state="running", heartbeat_at=now)
    DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=3, error="bad")
    LagSnapshot.objects.create(group_id="billing", lag_records=3, lag_seconds=1.0, taken_at=now)
    families = {}
    for family in text_string_to_metric_families(render_metrics().decode()):
        labels = families.setdefault(family.name, set())
        for sample in family.samples:
            labels.update(sample.labels)
    return families


def test_every_metric_and_label_the_alerting_rules_use_is_exported(exported):
    usage = used(rule_expressions().values())
    assert usage and not unknown(usage, exported), unknown(usage, exported)


def test_every_metric_and_label_the_grafana_dashboard_uses_is_exported(exported):
    usage = used(dashboard_expressions())
    assert usage and not unknown(usage, exported), unknown(usage, exported)


def test_a_renamed_metric_or_label_would_be_caught(exported):
    usage = used(['tally_pipeline_lag_record > 5', 'tally_pipeline_status{state="STALL"} == 1'])
    assert unknown(usage, exported) == ["tally_pipeline_lag_record: not exported",
                                        "tally_pipeline_status: no label state"]


def test_the_rules_cover_lag_loss_duplicates_stalls_runs_down_and_dead_letters():
    by_metric = {name: alert for alert, expr in rule_expressions().items() for name in used([expr])}
    for metric in ("tally_pipeline_lag_records", "tally_pipeline_lag_seconds", "tally_pipeline_lost_records",
                   "tally_pipeline_duplicated_records", "tally_pipeline_status", "tally_pipeline_consumer_up",
                   "tally_pipeline_dead_letters_pending"):
        assert metric in by_metric, f"no alerting rule on {metric}"
    assert 'status=~"STALL|STOP"' in rule_expressions()["TallyStalled"]


@pytest.mark.django_db
def test_consumer_up_and_pending_dead_letters_follow_the_database():
    now = timezone.now()
    running = Pipeline.objects.create(name="running", topic="t", sink_table="a", desired_state="running")
    Pipeline.objects.create(name="down", topic="t", sink_table="b", desired_state="running")
    ConsumerRun.objects.create(pipeline=running, epoch=1, host="h", pid=1, state="running", heartbeat_at=now)
    DeadLetter.objects.create(pipeline=running, partition=0, offset=1, error="bad")
    DeadLetter.objects.create(pipeline=running, partition=0, offset=2, error="bad", discarded_at=now)

    samples = {(f.name, s.labels["pipeline"]): s.value
               for f in text_string_to_metric_families(render_metrics().decode()) for s in f.samples
               if f.name in ("tally_pipeline_consumer_up", "tally_pipeline_dead_letters_pending")}
    assert samples[("tally_pipeline_consumer_up", "running")] == 1.0
    assert samples[("tally_pipeline_consumer_up", "down")] == 0.0
    assert samples[("tally_pipeline_dead_letters_pending", "running")] == 1.0
    assert samples[("tally_pipeline_dead_letters_pending", "down")] == 0.0
