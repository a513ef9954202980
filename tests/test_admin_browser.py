"""The Django admin in a real browser (Playwright driving Debian's Chromium): an operator selects two
pipelines, rewinds them with a preview and one confirmation, and the positions and sinks move; a viewer
sees read-only pages without actions; admin rows and dashboard pages link to each other. Saves a screenshot
of the rewind preview (to docs/screenshots/ with `make screenshots`)."""
import re

import pytest
from playwright.sync_api import expect

from consumers.models import ActionLog, PartitionOffset
from tests.admin_support import staff_operator, staff_viewer
from tests.conftest import screenshot_dir
from tests.test_admin_kafka import sink_offsets
from tests.test_browser_dashboard import browser, page  # noqa: F401 (fixtures)
from tests.views_helpers import PASSWORD, consumed_pipeline, drop_sink, make_pipeline

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def admin_log_in(page, live_server, user):  # noqa: F811
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#site-name")).to_contain_text("Tally administration")


@pytest.mark.kafka
def test_an_operator_rewinds_two_pipelines_from_the_admin_with_a_preview(page, live_server, kafka_bootstrap,  # noqa: F811
                                                                        make_topic):
    orders = consumed_pipeline(kafka_bootstrap, make_topic("brw-orders"), "brw-orders", 20)
    payments = consumed_pipeline(kafka_bootstrap, make_topic("brw-payments"), "brw-payments", 12)
    try:
        admin_log_in(page, live_server, staff_operator())
        page.goto(f"{live_server.url}/admin/consumers/pipeline/")
        for pipeline in (orders, payments):
            page.locator(f"input[name=_selected_action][value='{pipeline.pk}']").check()
        page.locator("select[name=action]").select_option("rewind")
        page.get_by_role("button", name="Go").click()

        expect(page.locator("#rewind-form")).to_be_visible()
        page.locator("input[name=mode][value=shift-by]").check()
        page.get_by_label("Value").fill("-4")
        page.get_by_label("Roll back the sink").check()
        page.locator("#preview-rewind").click()

        for name, before in (("brw-orders", 20), ("brw-payments", 12)):
            rows = page.locator(f"#preview-table-{name} tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.locator("td")).to_have_text(["0", f"{before} → {before - 4}", "4", "0", "4"])
        assert [PartitionOffset.objects.get(pipeline=p).next_offset for p in (orders, payments)] == [20, 12]
        page.screenshot(path=str(screenshot_dir() / "admin-rewind-preview.png"), full_page=True)

        page.locator("#execute-rewind").click()

        expect(page).to_have_url(re.compile(r"/admin/consumers/pipeline/$"))
        messages = page.locator("ul.messagelist")
        expect(messages).to_contain_text("Pipeline brw-orders: rewind done: shift-by -4: p0 20->16")
        expect(messages).to_contain_text("Pipeline brw-payments: rewind done: shift-by -4: p0 12->8")
        assert [PartitionOffset.objects.get(pipeline=p).next_offset for p in (orders, payments)] == [16, 8]
        assert sink_offsets(orders.sink_table) == [(o, o + 1) for o in range(16)]
        assert sink_offsets(payments.sink_table) == [(o, o + 1) for o in range(8)]
        assert set(ActionLog.objects.filter(action="rewind", dry_run=False).values_list("actor", "result")) == {
            ("otto", "done")}

        page.goto(f"{live_server.url}/admin/consumers/actionlog/")
        expect(page.locator("#result_list")).to_contain_text("otto")
        expect(page.locator("#result_list")).to_contain_text("rewind")
    finally:
        drop_sink(orders.sink_table)
        drop_sink(payments.sink_table)


def test_a_viewer_gets_read_only_admin_pages_without_actions(page, live_server):  # noqa: F811
    make_pipeline("orders")
    admin_log_in(page, live_server, staff_viewer())
    page.goto(f"{live_server.url}/admin/consumers/pipeline/")
    expect(page.locator("#result_list")).to_contain_text("orders")
    expect(page.locator("select[name=action]")).to_have_count(0)
    expect(page.locator("input[name=_selected_action]")).to_have_count(0)
    page.goto(f"{live_server.url}/admin/consumers/deadletter/")
    expect(page.locator("#result_list")).to_contain_text("not-a-number")
    expect(page.locator("select[name=action]")).to_have_count(0)


def test_an_admin_row_links_to_its_dashboard_page_and_back(page, live_server):  # noqa: F811
    orders = make_pipeline("orders")
    admin_log_in(page, live_server, staff_operator())
    page.goto(f"{live_server.url}/admin/consumers/pipeline/")
    page.locator("#result_list a.dashboard-link", has_text="orders").click()
    expect(page).to_have_url(re.compile(r"/pipelines/orders/$"))
    page.locator("#admin-link").click()
    expect(page).to_have_url(re.compile(rf"/admin/consumers/pipeline/{orders.pk}/change/$"))
