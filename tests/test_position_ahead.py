"""A stored position above the log end (topic recreated, broker data loss) on the real broker: the engine
stops with "position ahead of log end", reconciliation says ERR, an alert fires, and the pipeline page
offers the rewind that fixes it."""
import re

import pytest

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Alert
from consumers.engine import commit, db
from consumers.engine.python import run_pipeline
from consumers.models import DeliveryMode, PartitionOffset
from consumers.reconciliation.reconcile import reconcile_pipeline
from tests.chaos import produce_values
from tests.conftest import drop_sink_tables
from tests.pipelines import create_pipeline
from tests.views_helpers import make_operator, make_viewer

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]


@pytest.fixture
def ahead_pipeline(transactional_db, kafka_bootstrap, make_topic):
    topic = make_topic("ahead")
    produce_values(topic, range(1, 11))
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value",
                               DeliveryMode.EXACTLY_ONCE, batch_size=10)
    conn = db.connect()
    commit.ensure_positions(conn, pipeline.pk, {0: 500})  # read up to 500 of a topic since recreated
    conn.close()
    yield pipeline
    drop_sink_tables([pipeline.sink_table])


def test_a_position_ahead_of_the_log_end_stops_the_run_alerts_and_offers_the_rewind(ahead_pipeline, client):
    result = run_pipeline(ahead_pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "error" and "position ahead of log end" in result.detail
    assert "above the log end 10" in result.detail
    assert PartitionOffset.objects.get(pipeline=ahead_pipeline).next_offset == 500  # nothing moved

    report = reconcile_pipeline(ahead_pipeline)
    assert report.status == "ERR" and report.partitions[0].status == "ERR"

    ensure_default_rules()
    evaluate_all()
    assert Alert.objects.filter(pipeline=ahead_pipeline).exists()

    client.force_login(make_viewer())
    html = client.get(f"/pipelines/{ahead_pipeline.name}/").content.decode()
    callout = re.search(r'<article class="callout bad" id="ahead-0">.*?</article>', html, re.S).group(0)
    assert "position ahead of log end" in callout and "500" in callout
    link = re.search(r'href="([^"]+)" id="ahead-rewind-0"', callout).group(1).replace("&amp;", "&")
    assert link == f"/pipelines/{ahead_pipeline.name}/rewind/?mode=to-latest&partitions=0"
    client.force_login(make_operator())
    form = client.get(link).content.decode()
    assert re.search(r'value="to-latest"[^>]*checked', form) and 'value="0"' in form
