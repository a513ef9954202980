"""Kafka went down after its cluster's check passed: the fixture every door's test of that window uses. No tests here.

A passing check (clusters.preflight) is trusted for PREFLIGHT_TTL_S, so for that long a door's Kafka calls go
straight to kafka-python, whose clients fail with their own errors (KafkaTimeoutError "Unable to bootstrap",
NoBrokersAvailable, ...) rather than Tally's KafkaUnreachable."""
import time

import pytest

from consumers.kafka import clusters
from consumers.kafka.broker import free_port


@pytest.fixture
def kafka_went_down(settings, monkeypatch):
    """Nothing listens at the default cluster's address, and its check passed a moment ago. Returns the address."""
    settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{free_port()}"
    settings.KAFKA_REQUEST_TIMEOUT_MS = 600  # how long kafka-python tries to bootstrap (a consumer needs > 500 ms)
    monkeypatch.setitem(clusters._passed, repr(clusters.get()), time.monotonic())
    clusters.close_shared_admins()  # a shared client of another test would answer from its own connection
    yield settings.KAFKA_BOOTSTRAP_SERVERS
    clusters.close_shared_admins()


def kafka_refusal(message: str) -> bool:
    """Whether `message` is the refusal of an operation that found Kafka down (errors.Unavailable)."""
    return message.startswith("Kafka: ") and message.endswith("; nothing was changed")
