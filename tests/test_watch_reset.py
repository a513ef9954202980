"""A group whose offsets are reset behind what the watch already settled: the re-read records are audited
again, so what the consumer writes a second time is found."""
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from psycopg2 import sql

from consumers.kafka import admin
from consumers.models import WatchFinding, WatchRange
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit
from tests.watch_helpers import as_offsets, drop_tables, produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def table_name():
    name = f"team_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(name)).as_string(cur.cursor))
    yield name
    drop_tables(name)


def write(table: str, ids) -> None:
    with connection.cursor() as cur:
        for value in ids:
            cur.execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table)).as_string(cur.cursor),
                        [value])


def test_a_reset_behind_the_audit_reopens_the_ranges_and_finds_the_rewritten_records(make_topic, table_name):
    topic = make_topic("reset")
    produce(topic, [(None, str(v).encode()) for v in range(1, 11)])
    write(table_name, [v for v in range(1, 11) if v != 3])   # the record with value 3 (offset 2) was lost
    admin.commit_offsets("reset-group", topic, {0: 10})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="reset", group="reset-group", topic=topic,
                                                        sink_table=table_name, record_id="value", row_id="id",
                                                        settle_seconds=0))
    now = timezone.now()
    first = watch_audit.check_watch(watch, now=now)
    assert (first.checked, first.lost, first.duplicated) == (10, 1, 0)

    admin.commit_offsets("reset-group", topic, {0: 5})   # the team resets the group to offset 5
    reset = watch_audit.check_watch(watch, now=now + timedelta(seconds=30))
    assert reset.status == "ERR" and reset.partitions[0]["settled_offset"] == 5
    assert (reset.checked, reset.lost, as_offsets(reset.lost_offsets)) == (5, 1, {(0, 2)})

    write(table_name, range(6, 11))   # it reads offsets 5..9 again and writes their rows a second time
    admin.commit_offsets("reset-group", topic, {0: 10})
    after = watch_audit.check_watch(watch, now=now + timedelta(seconds=60))
    assert (after.checked, after.lost, after.duplicated) == (10, 1, 5)
    assert as_offsets(after.duplicated_offsets) == {(0, o) for o in range(5, 10)}
    assert sorted(WatchFinding.objects.filter(watch=watch).values_list("offset", "kind")) == \
        [(2, "lost")] + [(o, "duplicated") for o in range(5, 10)]
    assert sum(r.records for r in WatchRange.objects.filter(watch=watch)) == 10
