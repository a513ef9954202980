"""The overview (and the Watches page) read a fixed number of queries however many pipelines, watches and
sampled groups there are (issue 32: 200 pipelines and 200 watches in under 200 ms), and their rows show what
each consumer's stored reconciliation says."""
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from consumers.models import LagSnapshot, PipelineHealth, Watch, WatchPartition
from tests.views_helpers import client_of, make_pipeline, make_viewer

pytestmark = pytest.mark.django_db

# The overview's page, the live fragment htmx polls from the same URL, and the Watches page and its fragment.
PAGES = [("/", {}), ("/", {"HTTP_HX_REQUEST": "true"}), ("/watches/", {}), ("/watches/", {"HTTP_HX_REQUEST": "true"})]


def make_watch(name: str, partitions: int = 2, lost: int = 0, checked_at=None):
    watch = Watch.objects.create(name=name, group_id=f"team-{name}", topic=f"{name}-topic", lag_records=3,
                                 lag_seconds=1.5, checked_at=checked_at, sink_table=f"{name}_rows")
    for p in range(partitions):
        WatchPartition.objects.create(watch=watch, partition=p, start_offset=0, settled_offset=5, committed=5,
                                      high_watermark=8, lag_records=3, lost=lost if p == 0 else 0,
                                      checked_at=checked_at)
    return watch


def add_consumers(first: int, count: int) -> None:
    """`count` more of each: a pipeline with its history, a watch with partitions, a sampled external group."""
    now = timezone.now()
    for i in range(first, first + count):
        make_pipeline(name=f"p{i:03d}", topic=f"topic-{i}", lost=i % 2)
        make_watch(f"w{i:03d}", lost=i % 3, checked_at=now - timedelta(minutes=i))
        LagSnapshot.objects.create(group_id=f"other-{i}", taken_at=now, lag_records=i, lag_seconds=0.5)
    # A snapshot pass samples every group Kafka lists: the groups added before are in this pass too.
    LagSnapshot.objects.filter(pipeline__isnull=True, group_id__startswith="other-").update(taken_at=now)


def queries_of(client) -> list[int]:
    counts = []
    for url, headers in PAGES:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url, **headers)
            assert response.status_code == 200
        counts.append(len(queries.captured_queries))
    return counts


def test_the_overview_and_watches_pages_cost_the_same_queries_for_3_and_for_30_consumers_of_each_kind():
    client = client_of(make_viewer())
    add_consumers(0, 3)
    with_3 = queries_of(client)
    add_consumers(3, 27)
    with_30 = queries_of(client)
    html = client.get("/").content.decode()
    assert html.count('<tr id="pipeline-') == 30 and html.count('<tr id="watch-') == 30
    assert html.count('<tr id="group-other-') == 30
    assert with_30 == with_3


def test_each_row_shows_its_own_consumer_status_counts_and_check(client):
    now = timezone.now()
    make_pipeline(name="calm", topic="calm-topic")
    make_pipeline(name="leaky", topic="leaky-topic", lost=7, status="ERR")
    PipelineHealth.objects.filter(pipeline__name="leaky").update(records_per_second=None, lag_seconds=4000)
    make_watch("never-checked")
    make_watch("checked", lost=3, checked_at=now - timedelta(minutes=5))
    client.force_login(make_viewer())
    html = client.get("/").content.decode()

    leaky = row_of(html, "pipeline-leaky")
    assert 'data-status="ERR"' in leaky and "badge-err" in leaky
    assert '<td class="num bad" data-label="Lost" data-field="lost">⚠ 7</td>' in leaky
    assert 'data-field="lag_seconds">1 h 6 min</td>' in leaky and 'data-field="records_per_second">—</td>' in leaky
    calm = row_of(html, "pipeline-calm")
    assert '<td class="num " data-label="Lost" data-field="lost">0</td>' in calm
    assert 'data-field="records_per_second">42.0/s</td>' in calm and 'href="/pipelines/calm/"' in calm
    assert "calm-topic → sink_calm · stopped" in calm

    assert "never</td>" in row_of(html, "watch-never-checked")
    checked = row_of(html, "watch-checked")
    assert '<td class="num bad" data-label="Lost" data-field="lost">⚠ 3</td>' in checked
    assert "5\xa0minutes ago</time>" in checked and 'href="/watches/checked/"' in checked


def row_of(html: str, row_id: str) -> str:
    start = html.index(f'<tr id="{row_id}"')
    return html[start:html.index("</tr>", start)]
