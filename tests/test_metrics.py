"""/metrics: Prometheus text with lag, throughput, loss/duplication counts and status per pipeline and
partition, for a logged-in user or a token, and nobody else."""
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from tests.views_helpers import make_pipeline, make_viewer

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
    partition = (("cluster", "default"), ("partition", "0"), ("pipeline", "payments"), ("topic", "orders-topic"))
    assert found[("tally_partition_lost_records", partition)] == 3
    assert found[("tally_partition_high_watermark", partition)] == 120
    assert found[("tally_partition_db_offset", partition)] == 100
    assert found[("tally_partition_status", tuple(sorted((*partition, ("status", "ERR")))))] == 1


def test_metrics_accept_a_token_and_refuse_anonymous_scrapes(client):
    make_pipeline("orders")
    token = Token.objects.create(user=make_viewer())
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token.key}")
    assert response.status_code == 200
    assert b'tally_pipeline_lag_records{cluster="default",delivery_mode="exactly_once",pipeline="orders"' in (
        response.content)
