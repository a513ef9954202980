"""The demo page: each card's numbers and grid come from what the sink holds, a finished pipeline shows
its verdict while others still run, the seed is shown and can be run again, the classic preset sits
beside the post's result, and bad input changes nothing."""
import re

import pytest
from django.test import Client
from psycopg2 import sql

from consumers.demo import runs as demo_runs
from consumers.demo.schedule import MAX_SEED
from consumers.engine import db, sinks
from consumers.engine.transforms import resolve
from dashboard.views.demo import CLASSIC_PRESET, value_ranges
from tests.views_helpers import make_operator, make_viewer

pytestmark = pytest.mark.django_db(transaction=True)
AT_MOST_ONCE, AT_LEAST_ONCE = "demo_nums_at_most_once", "demo_nums_at_least_once"


@pytest.fixture
def sink_tables():
    conn = db.connect("test")
    yield conn
    with conn.cursor() as cursor:
        for table in (AT_MOST_ONCE, AT_LEAST_ONCE):
            sinks.drop_sink_table(cursor, table)
    conn.commit()
    conn.close()


def fill(conn, table, values):
    with conn.cursor() as cursor:
        sinks.ensure_sink_table(cursor, table, resolve("int_value"), False)
        for value in values:
            cursor.execute(sql.SQL("INSERT INTO {} (id, source_topic, source_partition, source_offset) "
                                   "VALUES (%s, 'nums', 0, %s)").format(sql.Identifier(table)), [value, value - 1])
    conn.commit()


def operator():
    client = Client()
    client.force_login(make_operator())
    return client


def cells(html, pipeline):
    card = html.split(f'id="demo-{pipeline}"')[1].split("</article>")[0]
    return {int(v): (int(c), kind) for kind, v, c in
            re.findall(r'<li class="cell (\w+)" data-value="(\d+)" data-count="(\d+)"', card)}, card


def test_value_ranges_name_the_values_briefly():
    assert value_ranges([1, 2, 3, 7, 9, 10]) == "1–3, 7, 9–10"
    assert value_ranges([]) == "" and value_ranges([4]) == "4"


def test_a_finished_pipeline_shows_its_numbers_and_grid_while_another_still_runs(redis_state, sink_tables):
    fill(sink_tables, AT_MOST_ONCE, [v for v in range(1, 21) if v not in (5, 6, 7)])
    fill(sink_tables, AT_LEAST_ONCE, [1, 2, 3, 2])
    demo_runs.write_state({"run_id": "r1", "state": "running", "records": 20, "crash_probability": 0.2,
                           "seed": 4242, "pipelines": {
                               "nums-at-most-once": {"state": "done", "restarts": 1, "elapsed_s": 9.5, "crashes": [
                                   {"attempt": 1, "point": "after-kafka-commit", "classic": True}]},
                               "nums-at-least-once": {"state": "running", "restarts": 0, "crashes": []}}})
    html = operator().get("/demo/", HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<div id="demo-progress" hx-get="/demo/"')   # still polling
    assert 'id="demo-seed">4242<' in html
    lossy, card = cells(html, "nums-at-most-once")
    assert {v for v, (count, kind) in lossy.items() if kind == "lost"} == {5, 6, 7}
    assert all(lossy[v] == (1, "once") for v in range(1, 21) if v not in (5, 6, 7)) and len(lossy) == 20
    assert 'title="5: not in the sink"' in card
    assert re.search(r'Each of 1…20 exactly once: <b class="exactly-once">no</b>', card)
    assert '<b class="received">17</b> of 20' in card and "5–7" in card
    assert "after-kafka-commit — the classic crash" in card
    # Still running: the grid fills in (2 is there twice so far), the verdict waits for the end.
    running, card = cells(html, "nums-at-least-once")
    assert running[2] == (2, "dup") and running[1] == (1, "once") and running[9] == (0, "pending")
    assert "exactly once:" not in card and "4 rows so far" in card


def test_the_seed_is_run_again_and_the_classic_preset_has_its_fixed_setup(redis_state, monkeypatch):
    queued = []

    class FakeCelery:   # records what would be enqueued instead of sending it
        def signature(self, name, args):
            assert name == demo_runs.RUN_DEMO_TASK
            return type("Signature", (), {"delay": lambda _self: queued.append(args)})()

    monkeypatch.setattr(demo_runs, "current_app", FakeCelery())
    client = operator()
    client.post("/demo/run/", {"records": 30, "crash_probability": 0.3, "seed": "123"})
    assert queued[-1][1:] == (30, 0.3, 123)
    redis_state.delete(demo_runs.LOCK_KEY)
    state = demo_runs.read_state()
    demo_runs.write_state({**state, "state": "done"})
    page = client.get("/demo/").content.decode()
    assert "Run again with seed 123" in page
    client.post("/demo/run/", {"preset": "classic"})
    assert queued[-1][1:] == (CLASSIC_PRESET["records"], CLASSIC_PRESET["crash_probability"], CLASSIC_PRESET["seed"])
    assert demo_runs.read_state()["preset"] == "classic"
    redis_state.delete(demo_runs.LOCK_KEY)
    client.post("/demo/run/", {"records": 30, "crash_probability": 0.3, "seed": ""})
    assert len(queued) == 3 and 1 <= queued[-1][3] <= MAX_SEED   # blank: a new seed, shown on the page
    assert f'id="demo-seed">{queued[-1][3]}<' in client.get("/demo/").content.decode()


def test_the_classic_preset_shows_the_posts_result_beside_this_runs(redis_state, sink_tables):
    fill(sink_tables, AT_MOST_ONCE, [v for v in range(1, 101) if not 31 <= v <= 40])
    demo_runs.write_state({"run_id": "r2", "state": "done", "records": 100, "crash_probability": 0.1,
                           "seed": CLASSIC_PRESET["seed"], "preset": "classic",
                           "pipelines": {"nums-at-most-once": {"state": "done", "restarts": 1, "crashes": []}}})
    page = operator().get("/demo/").content.decode()
    assert "The post: <b>91 of 100</b> received · this run: <b>90 of 100</b>" in page


@pytest.mark.parametrize("form", [{"records": 30, "crash_probability": 0.2, "seed": "-1"},
                                  {"records": 30, "crash_probability": 0.2, "seed": "1000000"},
                                  {"records": 30, "crash_probability": 0.2, "seed": "abc"},
                                  {"preset": "mine"}])
def test_bad_demo_input_is_refused_and_nothing_is_queued(redis_state, form):
    response = operator().post("/demo/run/", form, follow=True)
    assert response.status_code == 200
    assert re.search("seed must be|Unknown preset", response.content.decode())
    assert demo_runs.read_state() is None and redis_state.get(demo_runs.LOCK_KEY) is None


def test_a_viewer_sees_the_page_but_cannot_run_it(redis_state):
    viewer = Client()
    viewer.force_login(make_viewer())
    assert viewer.post("/demo/run/", {"preset": "classic"}).status_code == 403
    assert "Run the classic example" not in viewer.get("/demo/").content.decode()
