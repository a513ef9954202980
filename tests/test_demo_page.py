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
    redis_state.set(demo_runs.LOCK_KEY, "r1", ex=demo_runs.LEASE_SECONDS)   # the run is alive: it holds the demo
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


@pytest.mark.parametrize("stage", ["queued", "running"])
def test_a_run_whose_lock_is_gone_shows_as_interrupted_without_polling_and_a_new_run_may_start(
        redis_state, monkeypatch, stage):
    # The worker running it was SIGKILLed: its state still says queued/running, but its lease on the lock ran out.
    queued = []

    class FakeCelery:
        def signature(self, name, args):
            return type("Signature", (), {"delay": lambda _self: queued.append(args)})()

    monkeypatch.setattr(demo_runs, "current_app", FakeCelery())
    demo_runs.write_state({"run_id": "dead1", "state": stage, "records": 20, "crash_probability": 0.2, "seed": 7,
                           "pipelines": {"nums-exactly-once": {"state": "running", "restarts": 0, "crashes": []}}})
    client = operator()
    html = client.get("/demo/", HTTP_HX_REQUEST="true").content.decode()
    assert html.lstrip().startswith('<div id="demo-progress"') and "hx-trigger" not in html   # no polling
    assert "<progress" not in html
    assert 'id="demo-state">interrupted<' in html and "This demo run was interrupted" in html
    assert "Run again with seed 7" in html
    grid, card = cells(html, "nums-exactly-once")   # its pipeline too: no verdict, its unread values not "lost"
    assert 'data-state="interrupted"' in card and "Interrupted before it caught up" in card
    assert "exactly once:" not in card and {kind for _, kind in grid.values()} == {"pending"}
    run_id = demo_runs.request_run(20, 0.2, "alice", 8)
    assert queued == [(run_id, 20, 0.2, 8)] and demo_runs.read_state()["state"] == "queued"
    assert 'id="demo-state">queued<' in client.get("/demo/").content.decode()


def test_a_running_demo_holds_its_lock_on_a_short_lease_and_lets_it_go_at_the_end(redis_state, monkeypatch):
    from consumers.demo import classic

    seen = []

    def fake_demo(progress, **options):
        progress({"nums-exactly-once": {"state": "running"}})
        seen.append((redis_state.get(demo_runs.LOCK_KEY), redis_state.ttl(demo_runs.LOCK_KEY),
                     demo_runs.current_state()["state"]))
        return {"nums-exactly-once": {"state": "done"}}

    monkeypatch.setattr(classic, "run_classic_demo", fake_demo)
    monkeypatch.setattr(demo_runs, "reconcile_demo_pipelines", lambda: {})
    redis_state.set(demo_runs.LOCK_KEY, "live1", ex=demo_runs.QUEUED_SECONDS)
    demo_runs.write_state({"run_id": "live1", "state": "queued"})
    state = demo_runs.run("live1", 20, 0.2, 7, pipelines=["nums-exactly-once"])
    assert state["state"] == "done"
    assert seen == [(b"live1", pytest.approx(demo_runs.LEASE_SECONDS, abs=5), "running")]
    assert demo_runs.LEASE_SECONDS <= 60 and redis_state.get(demo_runs.LOCK_KEY) is None
    assert demo_runs.read_state()["state"] == "done"


def test_a_queued_run_whose_demo_another_run_took_does_nothing(redis_state, monkeypatch):
    from consumers.demo import classic

    monkeypatch.setattr(classic, "run_classic_demo", lambda **options: pytest.fail("the stale run started"))
    redis_state.set(demo_runs.LOCK_KEY, "newer", ex=demo_runs.LEASE_SECONDS)
    demo_runs.write_state({"run_id": "newer", "state": "running"})
    assert demo_runs.run("stale", 20, 0.2, 7)["state"] == "superseded"
    assert demo_runs.read_state() == {"run_id": "newer", "state": "running"}
    assert redis_state.get(demo_runs.LOCK_KEY) == b"newer"
