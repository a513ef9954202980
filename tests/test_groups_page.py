"""/groups/ after real runs: a pipeline's group (committed to Kafka by its run) is listed with the
pipeline's lag, never a 500; a missing value formats as a dash; a team's group links to the watch that audits it."""
import time
import uuid

import pytest
from kafka import KafkaConsumer

from consumers.engine.python import run_pipeline
from consumers.models import Watch
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import PipelineSpec
from consumers.reconciliation.reconcile import reconcile_pipeline
from dashboard.templatetags.tally import duration
from tests.conftest import drop_sink_tables
from tests.producing import into, send
from tests.views_helpers import make_viewer
from tests.watch_helpers import produce


@pytest.mark.parametrize("value, text", [(None, "—"), ("", "—"), ("n/a", "—"), (0.4, "0.4 s"), (185, "3 min 5 s")])
def test_durations_format_numbers_and_show_a_dash_for_anything_else(value, text):
    assert duration(value) == text


@pytest.fixture
def ran_pipeline(make_topic, settings):
    table = f"gp_{uuid.uuid4().hex[:8]}"
    topic = make_topic("groups-page")
    send(topic, into(None, range(25)))
    pipeline = pipeline_setup.create(PipelineSpec("groups-page", topic, table, create_table=True))
    yield pipeline
    drop_sink_tables([table])


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_groups_page_lists_a_pipeline_group_after_a_real_run(client, ran_pipeline):
    result = run_pipeline(ran_pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up"
    client.force_login(make_viewer())
    before_reconciliation = client.get("/groups/")
    assert before_reconciliation.status_code == 200
    reconcile_pipeline(ran_pipeline)
    page = client.get("/groups/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'href="/groups/{ran_pipeline.group_id}/"' in html and "Tally pipeline groups-page" in html
    row = html[html.index(f'href="/groups/{ran_pipeline.group_id}/"'):].split("</tr>")[0]
    assert '<td class="num">0</td>' in row  # the pipeline's lag once reconciled, caught up


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_an_external_group_that_a_watch_audits_links_to_its_watch(client, make_topic, settings):
    topic = make_topic("watched-group")
    produce(topic, [(None, b"1"), (None, b"2")])
    group = f"team-{uuid.uuid4().hex[:6]}"
    consumer = KafkaConsumer(topic, group_id=group, bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
                             auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000)
    assert read_until(consumer, 2)
    consumer.commit()
    consumer.close()
    Watch.objects.create(name="team-orders", group_id=group, topic=topic)
    client.force_login(make_viewer())

    html = client.get("/groups/").content.decode()
    row = html[html.index(f'href="/groups/{group}/"'):].split("</tr>")[0]
    assert 'external · watched by <a href="/watches/team-orders/">team-orders</a>' in row
    page = client.get(f"/groups/{group}/").content.decode()
    assert 'Tally watches this group: <a href="/watches/team-orders/">team-orders</a>' in page


def read_until(consumer, count: int, timeout_s: float = 30.0) -> bool:
    deadline, seen = time.monotonic() + timeout_s, 0
    while seen < count and time.monotonic() < deadline:
        seen += sum(len(batch) for batch in consumer.poll(timeout_ms=500).values())
    return seen >= count
