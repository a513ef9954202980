"""Factories shared by the dashboard's tests (views, API, metrics, browser): users in each role and a
pipeline with positions, reconciliation results, a ledger with a gap, an overlap and a rewind, snapshots,
dead letters and runs; and `fresh_throttles`, autouse in a test module that imports it. No tests here."""
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.cache import cache
from django.utils import timezone

from consumers.models import (
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    DeliveryMode,
    LagSnapshot,
    PartitionHealth,
    PartitionOffset,
    Pipeline,
    PipelineHealth,
    RunState,
)
from dashboard.roles import OPERATORS, VIEWERS, setup_roles

PASSWORD = "correct-horse-battery"


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Throttle counts live in the cache, per address: no test may leave another one throttled."""
    cache.clear()
    yield
    cache.clear()


def make_user(username: str, role: str):
    setup_roles()
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    user.groups.add(Group.objects.get(name=role))
    return user


def client_of(user):
    """A test client signed in as `user`."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def make_viewer(username="vera"):
    return make_user(username, VIEWERS)


def make_operator(username="otto"):
    return make_user(username, OPERATORS)


def make_superuser(username="root"):
    return get_user_model().objects.create_superuser(username, password=PASSWORD)


def api_token(user) -> str:
    """A new API token of `user` (knox keeps its digest): the key, known only now."""
    from knox.models import AuthToken

    return AuthToken.objects.create(user=user)[1]


def make_pipeline(name="orders", partitions=2, topic="orders-topic", delivery_mode=DeliveryMode.EXACTLY_ONCE,
                  lost=0, duplicated=0, status="OK", with_history=True):
    """A pipeline at offset 100 on every partition, reconciled, with a ledger whose partition 0 has a gap
    [40, 50), an overlap [60, 65) and a rewind to 80."""
    now = timezone.now()
    pipeline = Pipeline.objects.create(name=name, topic=topic, sink_table=f"sink_{name}".replace("-", "_"),
                                       delivery_mode=delivery_mode)
    PipelineHealth.objects.create(pipeline=pipeline, status=status, lost=lost, duplicated=duplicated, phantom=0,
                                  lag_records=20 * partitions, lag_seconds=12.5, records_per_second=42.0,
                                  checked_at=now)
    for p in range(partitions):
        PartitionOffset.objects.create(pipeline=pipeline, partition=p, next_offset=100)
        PartitionHealth.objects.create(pipeline=pipeline, partition=p, verified_offset=100, log_start=0,
                                       high_watermark=120, next_offset=100, kafka_committed=100, lag_records=20,
                                       lag_seconds=12.5, lost=lost if p == 0 else 0, status=status, checked_at=now,
                                       findings=[{"kind": "lost", "start": 40, "end": 50, "count": 10}]
                                       if lost and p == 0 else [])
    if not with_history:
        return pipeline
    ranges = [(0, 40, None), (50, 65, None), (60, 100, 80)] if partitions else []
    for first, end, superseded in ranges:
        BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=first, end_offset=end,
                                   records=end - first, rows_written=end - first, epoch=1, superseded_from=superseded)
    BatchLedger.objects.create(pipeline=pipeline, partition=0, first_offset=80, end_offset=100, records=20,
                               rows_written=20, epoch=2)
    for p in range(1, partitions):
        BatchLedger.objects.create(pipeline=pipeline, partition=p, first_offset=0, end_offset=100, records=100,
                                   rows_written=100, epoch=1)
    for minutes in range(10, 0, -1):
        LagSnapshot.objects.create(pipeline=pipeline, taken_at=now - timedelta(minutes=minutes),
                                   lag_records=minutes * 10, lag_seconds=minutes, records_per_second=40.0 + minutes)
    DeadLetter.objects.create(pipeline=pipeline, partition=1, offset=7, key=b"k7", value=b"not-a-number",
                              error="BadRecord: value is not an integer: b'not-a-number'")
    ConsumerRun.objects.create(pipeline=pipeline, epoch=2, host="worker-a", pid=4242, state=RunState.RUNNING,
                               assigned_partitions=list(range(partitions)), records_processed=180)
    return pipeline


def produce(bootstrap: str, topic: str, values, partition: int = 0) -> None:
    from tests.producing import into, send

    send(topic, into(partition, values), bootstrap=bootstrap)


def consumed_pipeline(bootstrap: str, topic: str, name: str, records: int):
    """A real exactly-once pipeline over `topic` that has consumed "1".."records" with the engine.
    Needs a transactional test (the engine writes through its own connection)."""
    from consumers.engine.python import run_pipeline
    from tests.pipelines import create_pipeline

    produce(bootstrap, topic, range(1, records + 1))
    pipeline = create_pipeline(name, topic, f"sink_{name}".replace("-", "_"), "int_value", batch_size=10)
    run_pipeline(name, stop_when_caught_up=True, max_seconds=60)
    return pipeline


def drop_sink(table: str) -> None:
    from django.db import connection

    from consumers.engine import sinks

    with connection.cursor() as cursor:
        sinks.drop_sink_table(cursor, table)
