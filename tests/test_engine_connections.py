"""Idle runs in one process share their PostgreSQL connections: one for the process's beat and the engine pool's
few, not two or three per run (consumers/engine/beat.py, consumers/engine/db.py). Hundreds of pipelines in one
engine host depend on it: PostgreSQL allows 100 connections by default."""
import threading

import pytest
from django.db import connection

from consumers.engine.python import run_pipeline
from consumers.models import DeliveryMode, PartitionOffset
from tests.chaos import produce_values, sink_counts, wait_for
from tests.conftest import drop_sink_tables, leftover_connections
from tests.pipelines import create_pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.usefixtures("kafka_client")]

RUNS = 6


def test_six_idle_runs_in_one_process_hold_the_beats_connection_and_at_most_the_pools(
        transactional_db, kafka_bootstrap, make_topic, settings):
    settings.TALLY_ENGINE_DB_CONNECTIONS = 2
    pipelines, threads, stop = [], [], threading.Event()
    for n in range(RUNS):
        topic = make_topic(f"conn{n}")
        produce_values(topic, range(1, 6))
        pipelines.append(create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), "int_value",
                                         DeliveryMode.EXACTLY_ONCE, batch_size=10))

    def run(name):
        try:
            run_pipeline(name, stop=stop, max_seconds=120)
        finally:
            connection.close()

    try:
        for pipeline in pipelines:
            threads.append(threading.Thread(target=run, args=(pipeline.name,), daemon=True))
            threads[-1].start()
        wait_for(lambda: PartitionOffset.objects.filter(next_offset=5).count() == RUNS, 60, "every run caught up")
        # Every connection to the test database but this test's own; one a client just closed may show a moment.
        bound = 1 + settings.TALLY_ENGINE_DB_CONNECTIONS
        wait_for(lambda: len(leftover_connections(settle_s=0)) <= bound, 10, f"at most {bound} connections open")
        assert all(sink_counts(p.sink_table) == {v: 1 for v in range(1, 6)} for p in pipelines)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        drop_sink_tables([p.sink_table for p in pipelines])
