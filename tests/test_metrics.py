"""/metrics: Prometheus text with lag, throughput, loss/duplication counts and status per pipeline and
partition, for a logged-in user or a token, and nobody else."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dashboard.metrics import STATUSES
from tests.views_helpers import api_token, make_pipeline, make_viewer

pytestmark = pytest.mark.django_db


def samples(body: str) -> dict:
    found = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_report_every_pipeline_and_partition_from_reconciliation(client):
    make_pipeline("orders")
    make_pipeline("payments", lost=3, duplicated=2, status="ERR")
    client.force_login(make_viewer())
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())
    payments = (("cluster", "default"), ("delivery_mode", "exactly_once"), ("pipeline", "payments"),
                ("topic", "orders-topic"))
    assert found[("tally_pipeline_lost_records", payments)] == 3
    assert found[("tally_pipeline_duplicated_records", payments)] == 2
    assert found[("tally_pipeline_lag_records", payments)] == 40
    assert found[("tally_pipeline_lag_seconds", payments)] == 12.5
    assert found[("tally_pipeline_throughput_records_per_second", payments)] == 42
    assert found[("tally_pipeline_status", tuple(sorted((*payments, ("status", "ERR")))))] == 1
    assert found[("tally_pipeline_status", tuple(sorted((*payments, ("status", "OK")))))] == 0
    every_state = [labels for name, labels in found if name == "tally_pipeline_status" and ("pipeline", "payments")
                   in labels]
    assert len(every_state) == len(STATUSES)
    partition = (("cluster", "default"), ("partition", "0"), ("pipeline", "payments"), ("topic", "orders-topic"))
    assert found[("tally_partition_lost_records", partition)] == 3
    assert found[("tally_partition_high_watermark", partition)] == 120
    assert found[("tally_partition_db_offset", partition)] == 100
    assert found[("tally_partition_status", tuple(sorted((*partition, ("status", "ERR")))))] == 1
    # A partition's status is its current state's series alone.
    assert [labels for name, labels in found if name == "tally_partition_status"
            and set(partition) <= set(labels)] == [tuple(sorted((*partition, ("status", "ERR"))))]


def test_metrics_accept_a_token_and_refuse_anonymous_scrapes(client):
    make_pipeline("orders")
    key = api_token(make_viewer())
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {key}")
    assert response.status_code == 200
    assert b'tally_pipeline_lag_records{cluster="default",delivery_mode="exactly_once",pipeline="orders"' in (
        response.content)


def test_group_lag_comes_only_from_the_latest_snapshot_pass_and_never_for_a_pipelines_group(client):
    """A group Kafka no longer lists (deleted, offsets expired) or that became a pipeline's group is not sampled
    by the next pass: its last sample must not be exported as its lag from then on."""
    from datetime import timedelta

    from django.utils import timezone

    from consumers.models import LagSnapshot, Pipeline

    earlier = timezone.now() - timedelta(minutes=1)
    for group, lag in (("billing", 500), ("retired-service", 9000), ("orders", 70)):
        LagSnapshot.objects.create(group_id=group, lag_records=lag, lag_seconds=30.0, taken_at=earlier)
    pipeline = Pipeline.objects.create(name="orders", topic="orders-topic", sink_table="sink_orders",
                                       group_id="orders")   # the group Tally now runs
    latest = earlier + timedelta(minutes=1)
    LagSnapshot.objects.create(group_id="billing", lag_records=3, lag_seconds=1.0, taken_at=latest)
    LagSnapshot.objects.create(pipeline=pipeline, group_id="orders", lag_records=0, lag_seconds=0.0,
                               taken_at=latest)
    client.force_login(make_viewer())

    found = samples(client.get("/metrics").content.decode())

    groups = {dict(labels)["group"]: value for (name, labels), value in found.items()
              if name == "tally_group_lag_records"}
    assert groups == {"billing": 3}


def test_metrics_answer_head_as_get_without_a_body_and_refuse_other_methods(client):
    make_pipeline("orders")
    client.force_login(make_viewer())
    head = client.head("/metrics")
    assert head.status_code == 200 and head["Content-Type"].startswith("text/plain") and head.content == b""
    refused = client.post("/metrics")
    assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"
