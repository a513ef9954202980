"""The new pages in a real browser: an operator adds a pipeline with the form (seeing the same refusal as
the command line first), starts it and watches the header and buttons follow without a reload, traces a
record, and switches the theme; the favicon is served."""

import pytest
from playwright.sync_api import expect

from consumers.models import Pipeline
from consumers.operations import actions
from tests.conftest import screenshot_dir
from tests.producing import into, send
from tests.test_browser_dashboard import browser, log_in, page  # noqa: F401  (fixtures)
from tests.views_helpers import make_operator
from tests.waiting import patience

pytestmark = [pytest.mark.browser, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def topic(make_topic):
    name = make_topic("browser-onboard")
    send(name, into(None, range(10)))
    return name


def test_an_operator_adds_a_pipeline_starts_it_and_the_page_follows(page, live_server, topic, table,  # noqa: F811
                                                                     monkeypatch):
    monkeypatch.setattr(actions, "enqueue_run", lambda *args, **kwargs: [])  # no worker: the state is what counts
    log_in(page, live_server, make_operator())
    page.get_by_role("link", name="Add a pipeline").first.click()
    page.get_by_label("Name", exact=True).fill("orders")
    page.get_by_label("Topic", exact=True).fill(topic)
    page.get_by_label("Sink table", exact=True).fill(table)
    page.locator("#create-pipeline").click()
    expect(page.locator("#error-sink_table")).to_contain_text("pass --create-table")
    expect(page.locator("#error-sink_table")).to_contain_text("CREATE TABLE")
    assert not Pipeline.objects.exists()
    page.get_by_label("Create the sink table if it is missing").check()
    page.locator("#create-pipeline").click()
    expect(page.get_by_role("heading", name="orders")).to_be_visible()
    expect(page.locator("#action-outcome")).to_contain_text("Created pipeline orders")
    expect(page.locator("#action-pause")).to_be_disabled()
    expect(page.locator("#action-pause")).to_have_attribute("title", "Cannot pause: it is not running (stopped).")

    page.locator("#action-start").click()
    expect(page.locator("#desired-state")).to_have_text("running")        # no reload: the header refreshed
    expect(page.locator("#action-start")).to_be_disabled()
    expect(page.locator("#action-pause")).to_be_enabled()
    actions.pause("orders", actor="someone-else")                          # changed elsewhere: the poll shows it
    expect(page.locator("#desired-state")).to_have_text("paused", timeout=patience(10) * 1000)
    expect(page.locator("#action-resume")).to_be_enabled()
    page.screenshot(path=str(screenshot_dir() / "pipeline-new.png"), full_page=True)


def test_an_operator_traces_a_record_and_switches_the_theme(page, live_server, topic, table):  # noqa: F811
    from consumers.engine.python import run_pipeline
    from consumers.operations import pipeline_setup
    from consumers.operations.pipeline_setup import PipelineSpec

    pipeline = pipeline_setup.create(PipelineSpec("traced", topic, table, create_table=True))
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/traced/")
    page.locator("#trace-link").first.click()
    page.get_by_label("Partition").fill("0")
    page.get_by_label("Offset").fill("4")
    page.locator("#trace-submit").click()
    expect(page.locator("#trace-0-4 .verdict")).to_have_text("written")
    expect(page.locator("#trace-0-4")).to_contain_text("value")
    assert "partition=0" in page.url and "offset=4" in page.url
    traced_url = page.url
    page.get_by_label("Offset").fill("x")
    page.locator("#trace-submit").click()
    expect(page.locator("#trace-error")).to_contain_text("offset: a whole number")

    toggle = page.locator("#theme-toggle")
    expect(toggle).to_have_text("◐ system")
    toggle.click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    dark_background = page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor")
    page.reload()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")   # the choice is kept
    page.goto(traced_url)
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")   # and on the next page
    expect(page.locator("#trace-0-4 .verdict")).to_have_text("written")
    page.screenshot(path=str(screenshot_dir() / "trace-dark.png"), full_page=True)
    page.locator("#theme-toggle").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    light_background = page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor")
    assert dark_background != light_background
    icon = page.request.get(f"{live_server.url}/favicon.ico")
    assert icon.ok and icon.headers["content-type"].startswith("image/svg")


def test_charts_draw_a_single_sample_within_the_chosen_range(page, live_server):  # noqa: F811
    from django.utils import timezone

    from consumers.models import LagSnapshot
    from tests.views_helpers import make_pipeline

    pipeline = make_pipeline(with_history=False)
    LagSnapshot.objects.create(pipeline=pipeline, taken_at=timezone.now(), lag_records=40, records_per_second=12.5)
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/orders/?range=15m")
    expect(page.locator("#chart-throughput canvas")).to_have_count(1)
    expect(page.locator("#chart-throughput")).to_have_attribute("data-drawn", "1")
    expect(page.locator("#chart-lag")).to_have_attribute("data-drawn", "1")
    # The x axis spans the 15 minutes asked for (uPlot alone would stretch one sample over years).
    expect(page.locator("#chart-lag")).to_have_attribute("data-span", "900")


def test_an_operator_adds_an_alert_rule_and_mutes_it(page, live_server):  # noqa: F811
    from alerts.defaults import ensure_default_rules
    from alerts.models import AlertRule, Mute

    ensure_default_rules()
    log_in(page, live_server, make_operator())
    page.get_by_role("link", name="Alerts", exact=True).click()
    page.locator("#alert-rules-link").click()
    page.locator("#new-rule").click()
    page.get_by_label("Name", exact=True).fill("Slow orders")
    page.get_by_label("Kind", exact=True).select_option("lag_seconds")
    page.locator("#save-rule").click()
    expect(page.locator("#error-threshold")).to_contain_text("compares with a threshold")
    page.get_by_label("Threshold", exact=True).fill("120")
    page.locator("#save-rule").click()
    expect(page.locator("#rules")).to_contain_text("Slow orders")
    rule = AlertRule.objects.get(name="Slow orders")
    row = page.locator(f"#rule-{rule.pk}")
    row.get_by_role("button", name="Mute").click()
    expect(page.locator(f"#rule-{rule.pk}")).to_contain_text("muted until")
    assert Mute.objects.filter(rule=rule).count() == 1
    expect(page.locator("#nav-api")).to_have_attribute("href", "/api/docs/")
    expect(page.locator("#nav-metrics")).to_have_attribute("href", "/metrics")
