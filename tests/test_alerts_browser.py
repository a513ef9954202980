"""The alerts page in a real browser (Playwright, Debian's Chromium) against a live server: an operator
filters (htmx swaps only the table), acknowledges and mutes; the same page works with JavaScript off."""
import os

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from playwright.sync_api import expect, sync_playwright

from alerts.models import Alert, AlertRule, AlertState, Mute, RuleKind
from consumers.models import Pipeline
from tests.conftest import screenshot_dir
from tests.waiting import patience

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PASSWORD = "pw-alerts-123"


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def new_page(browser, javascript=True):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, java_script_enabled=javascript)
    context.set_default_timeout(patience(15) * 1000)
    return context, context.new_page()


def operator():
    user = User.objects.create_user("olga", password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="operate_pipeline"))
    return user


def firing(name, summary):
    pipeline = Pipeline.objects.create(name=name, topic=name, sink_table=name.replace("-", "_"))
    rule = AlertRule.objects.create(name=f"{name} loss", kind=RuleKind.LOST, pipeline=pipeline)
    now = timezone.now()
    return Alert.objects.create(rule=rule, pipeline=pipeline, summary=summary, started_at=now, last_seen_at=now)


def log_in(page, live_server):
    page.goto(f"{live_server.url}/accounts/login/?next=/alerts/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Alerts")).to_be_visible()


def test_an_operator_filters_acknowledges_and_mutes_in_the_browser(browser, live_server):
    operator()
    orders = firing("orders", "3 lost records (partition 0: offsets 4-6)")
    payments = firing("payments", "2 duplicated records (partition 1: offsets 8-9)")
    context, page = new_page(browser)
    try:
        log_in(page, live_server)
        expect(page.locator(f"#alert-{orders.pk}")).to_contain_text("offsets 4-6")

        page.get_by_label("Pipeline").select_option("payments")  # htmx: only the table is swapped
        expect(page.locator(f"#alert-{orders.pk}")).to_have_count(0)
        expect(page.locator(f"#alert-{payments.pk}")).to_be_visible()
        assert "pipeline=payments" in page.url

        page.locator(f"#alert-{payments.pk}").get_by_role("button", name="Acknowledge").click()
        expect(page.locator("#messages")).to_contain_text("Acknowledged: payments")
        expect(page.locator(f"#alert-{payments.pk}")).to_contain_text("by olga")

        page.locator(f"#alert-{payments.pk}").get_by_label("Mute for").select_option("240")
        page.locator(f"#alert-{payments.pk}").get_by_role("button", name="Mute").click()
        expect(page.locator("#mutes")).to_contain_text("payments loss on payments")
        page.goto(f"{live_server.url}/alerts/")
        expect(page.locator(f"#alert-{orders.pk}")).to_be_visible()
        page.screenshot(path=str(screenshot_dir() / "alerts.png"), full_page=True)
    finally:
        context.close()

    payments.refresh_from_db()
    assert (payments.state, payments.acknowledged_by) == (AlertState.ACKNOWLEDGED, "olga")
    assert Mute.objects.get().pipeline.name == "payments"


def test_the_page_works_with_javascript_off(browser, live_server):
    operator()
    orders = firing("orders", "3 lost records (partition 0: offsets 4-6)")
    firing("payments", "2 duplicated records (partition 1: offsets 8-9)")
    context, page = new_page(browser, javascript=False)
    try:
        log_in(page, live_server)
        page.get_by_label("Pipeline").select_option("orders")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("tbody tr")).to_have_count(1)
        page.locator(f"#alert-{orders.pk}").get_by_role("button", name="Acknowledge").click()
        expect(page.locator(f"#alert-{orders.pk}")).to_contain_text("acknowledged")
        assert "pipeline=orders" in page.url  # back on the filtered list
    finally:
        context.close()
    orders.refresh_from_db()
    assert orders.state == AlertState.ACKNOWLEDGED
