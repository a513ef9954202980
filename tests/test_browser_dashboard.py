"""The dashboard in a real browser (Playwright driving Debian's Chromium) against a live server:
log in as viewer and operator, the overview updating live as records are produced and reconciled, a
rewind dry run then its execution from the page, and a viewer who cannot act. Saves screenshots of the
overview, the pipeline page and the demo page (to docs/screenshots/ with `make screenshots`)."""
import contextlib
import os
import re
import time

import pytest
from playwright.sync_api import expect, sync_playwright

from consumers.models import PartitionOffset
from tests.conftest import screenshot_dir
from tests.views_helpers import (
    PASSWORD,
    consumed_pipeline,
    drop_sink,
    make_operator,
    make_pipeline,
    make_viewer,
    produce,
)
from tests.waiting import patience

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make meanwhile are
    # still plain synchronous calls on the test's own connection. Only while the browser is up.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                                  args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(patience(15) * 1000)
    page = context.new_page()
    yield page
    context.close()


def log_in(page, live_server, user):
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


@contextlib.contextmanager
def reconciled_pipeline(bootstrap, topic, name, records):
    """Yields a pipeline that has consumed `records` records of `topic`, reconciled; its sink is dropped at the end."""
    from consumers.reconciliation.reconcile import reconcile_pipeline

    pipeline = consumed_pipeline(bootstrap, topic, name, records)
    try:
        reconcile_pipeline(pipeline)
        yield pipeline
    finally:
        drop_sink(pipeline.sink_table)


def test_a_viewer_logs_in_sees_everything_and_cannot_act(page, live_server):
    make_pipeline("orders", lost=3, status="ERR")
    log_in(page, live_server, make_viewer())
    expect(page.locator("#pipeline-orders")).to_contain_text("ERR")
    page.get_by_role("link", name="orders", exact=True).click()
    expect(page.locator("#viewer-note")).to_contain_text("only operators can")
    expect(page.get_by_role("button", name="Start")).to_have_count(0)
    # Even a hand-made request from the viewer's session is refused.
    status = page.evaluate("""async () => {
        const token = document.querySelector('[name=csrfmiddlewaretoken]').value;
        const response = await fetch('/pipelines/orders/actions/start/', {method: 'POST',
            headers: {'X-CSRFToken': token}});
        return response.status; }""")
    assert status == 403
    api = page.evaluate("""async () => {
        const token = document.querySelector('[name=csrfmiddlewaretoken]').value;
        const response = await fetch('/api/pipelines/orders/actions/start', {method: 'POST',
            headers: {'X-CSRFToken': token}});
        return [response.status, (await response.json()).detail]; }""")
    assert api[0] == 403 and "Only operators may act" in api[1]
    page.goto(f"{live_server.url}/pipelines/orders/rewind/")
    expect(page.locator("#rewind-panel")).to_contain_text("only operators can rewind")
    expect(page.locator("#rewind-form")).to_have_count(0)


@pytest.mark.kafka
def test_the_overview_updates_without_reload_when_records_are_produced(page, live_server, kafka_bootstrap, make_topic):
    from consumers.engine.python import run_pipeline
    from consumers.reconciliation.reconcile import reconcile_pipeline

    topic = make_topic("live")
    with reconciled_pipeline(kafka_bootstrap, topic, "live-orders", 10) as pipeline:
        log_in(page, live_server, make_operator())
        lag = page.locator("#pipeline-live-orders [data-field=lag_records]")
        expect(lag).to_have_text("0")
        page.evaluate("window.notReloaded = true")

        produce(kafka_bootstrap, topic, range(11, 26))
        reconcile_pipeline(pipeline)
        expect(lag).to_have_text("15", timeout=patience(10) * 1000)

        run_pipeline("live-orders", stop_when_caught_up=True, max_seconds=60)
        reconcile_pipeline(pipeline)
        expect(lag).to_have_text("0", timeout=patience(10) * 1000)
        expect(page.locator("#pipeline-live-orders [data-field=lost]")).to_have_text("0")
        assert page.evaluate("window.notReloaded") is True


@pytest.mark.kafka
def test_an_operator_rewinds_from_the_page_after_a_dry_run(page, live_server, kafka_bootstrap, make_topic):
    with reconciled_pipeline(kafka_bootstrap, make_topic("rewind"), "rewind-orders", 20) as pipeline:
        log_in(page, live_server, make_operator())
        page.goto(f"{live_server.url}/pipelines/rewind-orders/")
        page.locator("#rewind-link").click()
        page.locator("input[name=mode][value=shift-by]").check()
        page.get_by_label("Value").fill("-5")
        page.get_by_role("button", name="Preview (dry run)").click()

        preview = page.locator("#preview-table tbody tr")
        expect(preview).to_have_count(1)
        expect(preview.locator("td")).to_have_text(["0", "0", "20", "20", "15", "5", "0"])
        assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 20  # a dry run changes nothing

        page.get_by_role("button", name="Confirm: rewind rewind-orders").click()
        expect(page.locator("#action-outcome")).to_contain_text("Rewind done on rewind-orders")
        expect(page).to_have_url(re.compile(r"/pipelines/rewind-orders/$"))
        assert PartitionOffset.objects.get(pipeline=pipeline).next_offset == 15
        expect(page.locator(".actions-log").first).to_contain_text("rewind")


def test_bad_rewind_input_shows_the_error_next_to_the_field(page, live_server):
    make_pipeline("orders")
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/orders/rewind/")
    page.locator("input[name=mode][value=to-offset]").check()
    page.get_by_label("Value").fill("soon")
    page.keyboard.press("Enter")  # keyboard-usable: Enter submits the preview
    expect(page.locator("#value-errors")).to_have_text("to-offset needs an integer, got 'soon'.")
    assert list(PartitionOffset.objects.values_list("next_offset", flat=True)) == [100, 100]


def test_screenshots_of_the_overview_and_pipeline_page(page, live_server):
    """Rich fixture data (reconciled pipelines, a gap, an overlap, a rewind, snapshots) for the README."""
    make_pipeline("orders-exactly-once", partitions=3)
    make_pipeline("payments-at-least-once", partitions=2, duplicated=7, status="WARN",
                  delivery_mode="at_least_once")
    make_pipeline("clicks-at-most-once", partitions=2, lost=10, status="ERR", delivery_mode="at_most_once")
    log_in(page, live_server, make_operator())
    page.screenshot(path=str(screenshot_dir() / "overview.png"), full_page=True)
    page.goto(f"{live_server.url}/pipelines/clicks-at-most-once/")
    expect(page.locator("#chart-lag canvas")).to_have_count(1)
    page.screenshot(path=str(screenshot_dir() / "pipeline.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{live_server.url}/")
    page.screenshot(path=str(screenshot_dir() / "overview-phone.png"), full_page=False)
    assert (screenshot_dir() / "pipeline.png").stat().st_size > 10_000


@pytest.mark.kafka
@pytest.mark.celery
@pytest.mark.spark
@pytest.mark.timeout(1500)  # a JVM start and four pipelines on a shared two-core machine
def test_the_demo_shows_loss_duplicates_and_exactly_once_as_grids_matching_the_sinks(page, live_server, kafka_bootstrap,
                                                                                    celery_worker, settings):
    from consumers.demo.classic import DEMO_PIPELINES, sink_counts
    from tests.conftest import TEST_REDIS_URL

    settings.REDIS_URL = TEST_REDIS_URL  # the web side reads the progress the worker writes
    from consumers.demo import runs as demo_runs

    demo_runs._redis().delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)
    try:
        log_in(page, live_server, make_operator())
        page.goto(f"{live_server.url}/demo/")
        page.get_by_label("Records").fill("100")
        page.get_by_label("Crash probability per batch").fill("0.2")
        page.get_by_role("button", name="Run the demo").click()
        expect(page.locator("#demo-state")).to_have_text(re.compile("queued|running|done"))
        seed = page.locator("#demo-seed").inner_text()
        assert seed.isdigit()
        # Each card gets its verdict when its own pipeline is done (generous deadlines: a loaded machine).
        for name in ("nums-at-most-once", "nums-at-least-once", "nums-exactly-once", "nums-spark-exactly-once"):
            expect(page.locator(f"#demo-{name} .exactly-once")).to_be_visible(timeout=patience(600) * 1000)
        expect(page.locator("#demo-state")).to_have_text("done", timeout=patience(120) * 1000)
        assert int(page.locator("#demo-nums-at-most-once .lost-count").inner_text()) > 0
        assert int(page.locator("#demo-nums-at-least-once .duplicated-count").inner_text()) > 0
        for name in ("nums-exactly-once", "nums-spark-exactly-once"):
            expect(page.locator(f"#demo-{name} .exactly-once")).to_have_text("yes")
        for name in ("nums-at-most-once", "nums-at-least-once"):
            expect(page.locator(f"#demo-{name} .exactly-once")).to_have_text("no")
        # Every cell says what PostgreSQL holds for its value (0 = lost, 2+ = duplicated).
        for demo in DEMO_PIPELINES:
            counts = sink_counts(demo.sink_table)
            shown = page.locator(f"#demo-{demo.name} .value-grid li").evaluate_all(
                "cells => cells.map(c => [Number(c.dataset.value), Number(c.dataset.count), c.className])")
            assert [(v, n) for v, n, _ in shown] == [(v, counts.get(v, 0)) for v in range(1, 101)], demo.name
            kinds = {v: cls.split()[-1] for v, _, cls in shown}
            assert all(kinds[v] == ("lost" if counts.get(v, 0) == 0 else "once" if counts[v] == 1 else "dup")
                       for v in range(1, 101)), demo.name
        expect(page.get_by_role("button", name=f"Run again with seed {seed}")).to_be_visible()
        time.sleep(0.5)
        page.screenshot(path=str(screenshot_dir() / "demo.png"), full_page=True)
    finally:
        demo_runs._redis().delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)
        for demo in DEMO_PIPELINES:
            drop_sink(demo.sink_table)


def test_an_action_log_filter_the_server_refuses_shows_why_and_the_next_filter_still_works(page, live_server):
    """A 400 to an htmx filter was dropped: the page kept its old table and said nothing."""
    from consumers.models import Pipeline

    make_pipeline("orders")
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/action-log/")
    Pipeline.objects.filter(name="orders").delete()  # gone, without a trace in the log, since the page loaded
    with page.expect_response(lambda r: "pipeline=orders" in r.url) as answer:
        page.get_by_label("Pipeline").select_option("orders")
    assert answer.value.status == 400
    expect(page.locator("#action-log-entries #filter-error")).to_contain_text("No pipeline named 'orders'")
    page.get_by_label("Pipeline").select_option("")
    expect(page.locator("#filter-error")).to_have_count(0)
    expect(page.locator("#action-log-entries")).to_contain_text("Page 1 of 1")


def test_a_reason_in_the_request_error_region_is_cleared_by_the_next_request(page, live_server):
    """A 400 that no target can fit shows its reason above the page (#request-error); it belongs to that request
    only, so choosing a filter afterwards clears it."""
    make_pipeline("orders")
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/action-log/")
    page.evaluate("htmx.ajax('GET', '/action-log/?pipeline=a%00b', {target: '#action-log-entries'})")
    expect(page.locator("#request-error")).to_contain_text("The request holds a NUL character")
    page.get_by_label("Pipeline").select_option("orders")
    expect(page.locator("#request-error")).to_be_empty()
    expect(page.locator("#action-log-entries")).to_contain_text("Page 1 of 1")
