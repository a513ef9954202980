"""Helpers for the operating-layer tests: the demo topic and pipelines, producing, reading sinks row by row."""

from django.db import connection

from consumers.demo.classic import DEMO_PIPELINES, DEMO_TOPIC, seed_demo
from consumers.engine import sinks
from consumers.engine.python import run_pipeline
from consumers.models import Pipeline
from tests.producing import send
from tests.sink_rows import provenance_rows
from tests.waiting import wait_for  # noqa: F401 - re-exported: the suite's one wait helper

EXACTLY_ONCE, AT_LEAST_ONCE, AT_MOST_ONCE = "nums-exactly-once", "nums-at-least-once", "nums-at-most-once"
PARTITIONS = 2


def seed(records: int) -> None:
    seed_demo(records=records, partitions=PARTITIONS, reset=True)


def drop_demo_sinks() -> None:
    with connection.cursor() as cursor:
        for demo in DEMO_PIPELINES:
            sinks.drop_sink_table(cursor, demo.sink_table)


def produce(first_value: int, last_value: int) -> None:
    """Append values first..last to the demo topic, spread as seed_demo spreads them."""
    send(DEMO_TOPIC, [((value - 1) % PARTITIONS, None, str(value).encode())
                      for value in range(first_value, last_value + 1)])


def location(value: int) -> tuple[int, int]:
    """(partition, offset) of a value produced by seed/produce in order."""
    return (value - 1) % PARTITIONS, (value - 1) // PARTITIONS


def catch_up(name: str, max_seconds: float = 60):
    result = run_pipeline(name, stop_when_caught_up=True, max_seconds=max_seconds)
    assert result.reason == "caught_up", (result.reason, result.detail)
    return result


def sink_rows(name: str) -> list[tuple[int, int, int]]:
    """(partition, offset, id) of every row of the pipeline's sink, sorted; duplicates stay visible."""
    return provenance_rows(Pipeline.objects.get(name=name).sink_table)


def expected_rows(values) -> list[tuple[int, int, int]]:
    return sorted((*location(v), v) for v in values)


def positions(name: str) -> dict[int, int]:
    return dict(Pipeline.objects.get(name=name).offsets.values_list("partition", "next_offset"))


