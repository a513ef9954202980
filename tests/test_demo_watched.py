"""The demo's consumer that Tally does not run (examples/plain_consumer.py): killed on the classic schedule
between its commit and its write, and watched — the watch names exactly the values missing from its table."""
import pytest

from consumers.demo import watched
from consumers.demo.classic import seed_demo

pytestmark = [pytest.mark.kafka, pytest.mark.chaos, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def plain_table():
    yield
    from tests.watch_helpers import drop_tables

    drop_tables(watched.TABLE)


def test_the_watch_finds_exactly_what_the_plain_consumer_lost(kafka_bootstrap, plain_table, redis_state):
    seed_demo(records=100, partitions=1, reset=True)

    result = watched.run_watched_consumer(records=100, seed=618)

    assert result["state"] == "done" and result["kills"] == 1
    assert result["crash_batch"] == watched.classic_crash_batch(618, 100)
    assert result["lost_values"] == result["missing_in_table"] and result["lost"] == len(result["lost_values"]) > 0
    assert result["duplicated"] == 0 and result["checked"] == 100

    # The demo page says it in one line, with the values.
    from django.test import Client

    from consumers.demo import runs as demo_runs
    from tests.views_helpers import make_viewer

    demo_runs.write_state({"run_id": "r1", "state": "done", "records": 100, "crash_probability": 0.15, "seed": 618,
                           "pipelines": {}, "watched": result})
    client = Client()
    client.force_login(make_viewer())
    page = client.get("/demo/").content.decode()
    assert 'id="demo-watched"' in page and "examples/plain_consumer.py" in page
    assert ", ".join(map(str, result["lost_values"])) in page and f'href="/watches/{watched.WATCH_NAME}/"' in page
