"""consumers/migrations/0019: a watch audited before WatchFinding existed (0015) kept its findings only on its ranges;
after the upgrade its findings CSV (and the trace, which reads the same rows) must still name them. The migration's
function is run on real rows with the project's models (its historical models are the same ones)."""
import csv
import importlib
import io
from datetime import UTC, datetime

import pytest
from django.apps import apps

from consumers.models import Watch, WatchFinding, WatchPartition, WatchRange
from tests.views_helpers import client_of, make_viewer

pytestmark = pytest.mark.django_db
migration = importlib.import_module("consumers.migrations.0019_watch_findings_from_ranges")
AUDITED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def csv_findings(client, name) -> list[tuple]:
    response = client.get(f"/api/watches/{name}/findings.csv")
    assert response.status_code == 200
    rows = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    return [(int(r["partition"]), int(r["offset"]), r["kind"], int(r["extra_rows"])) for r in rows]


def test_findings_an_old_audit_kept_on_its_ranges_are_exported_after_the_upgrade_and_never_twice():
    watch = Watch.objects.create(name="old-audit", group_id="team", topic="events", sink_table="events_sink",
                                 record_id="value", row_id="id")
    for partition in (0, 1):
        WatchPartition.objects.create(watch=watch, partition=partition, start_offset=0, settled_offset=50)
    # Audited by the old version: findings listed on the range only.
    WatchRange.objects.create(watch=watch, partition=0, start=0, end=50, records=50, lost=2, duplicated=3,
                              phantom=1, lost_offsets=[7, 30], duplicated_offsets=[[9, 2], [40, 1]],
                              phantom_offsets=[12], checked_at=AUDITED)
    WatchRange.objects.create(watch=watch, partition=1, start=0, end=20, records=20, checked_at=AUDITED)
    # Audited since 0015: its finding row exists already.
    WatchRange.objects.create(watch=watch, partition=1, start=20, end=50, records=30, lost=1, lost_offsets=[21],
                              checked_at=AUDITED)
    WatchFinding.objects.create(watch=watch, partition=1, offset=21, kind="lost", checked_at=AUDITED)

    migration.copy_range_findings(apps, None)
    migration.copy_range_findings(apps, None)   # a second run adds nothing

    expected = [(0, 7, "lost", 0), (0, 9, "duplicated", 2), (0, 12, "phantom", 0), (0, 30, "lost", 0),
                (0, 40, "duplicated", 1), (1, 21, "lost", 0)]
    assert csv_findings(client_of(make_viewer()), "old-audit") == expected
    assert set(WatchFinding.objects.values_list("checked_at", flat=True)) == {AUDITED}
