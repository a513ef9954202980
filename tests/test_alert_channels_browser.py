"""Done when: an operator adds a PagerDuty channel in the browser; the next real loss reaches it once, though
the receiver was down when the loss fired, and the incident resolves there when the loss is fixed."""
import os
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone
from playwright.sync_api import expect

from alerts.defaults import ensure_default_rules
from alerts.evaluate import evaluate_all
from alerts.models import Channel
from alerts.outbox import deliver_due
from consumers.models import Status
from tests.conftest import screenshot_dir
from tests.receivers import Receiver
from tests.test_alerts_browser import browser, new_page  # noqa: F401 (the module's Chromium fixture)
from tests.test_alerts_email import lost, make_pipeline, report_health

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "pw-channels-123"
ROUTING_KEY = "BROWSER-R0UTING-KEY-42"


def test_an_operator_adds_pagerduty_in_the_browser_and_a_loss_reaches_it_once_after_an_outage(browser,  # noqa: F811
                                                                                               live_server):
    ensure_default_rules()
    user = User.objects.create_user("olga", password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="operate_pipeline"))
    pagerduty = Receiver(status=202, text='{"status":"success"}')  # down: nothing listens yet
    context, page = new_page(browser)
    try:
        page.goto(f"{live_server.url}/accounts/login/?next=/alerts/channels/")
        page.get_by_label("Username").fill("olga")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.get_by_role("button", name="New channel").click()
        page.get_by_label("Name").fill("oncall")
        page.get_by_label("Kind").select_option("pagerduty")
        page.get_by_label("URL").fill(f"{pagerduty.url}/v2/enqueue")
        page.get_by_label("Routing key").fill(ROUTING_KEY)
        page.get_by_role("button", name="Save").click()
        expect(page.locator("#messages")).to_contain_text("Alert channel 'oncall' added")
        expect(page.locator("#channel-oncall")).to_contain_text("routing key ••••••••")
        assert ROUTING_KEY not in page.content()
        page.screenshot(path=str(screenshot_dir() / "alert-channels.png"), full_page=True)
    finally:
        context.close()

    now = timezone.now()
    pipeline = make_pipeline("orders")
    report_health(pipeline, {0: ([lost(10, 13)], Status.OK)}, Status.ERR, at=now)
    evaluate_all(now=now)
    assert deliver_due(now=now)["failed"] == 1  # the receiver is down when the loss fires

    pagerduty.start()
    try:
        back = now + timedelta(seconds=5)
        assert deliver_due(now=back)["sent"] == 1
        evaluate_all(now=back + timedelta(seconds=30))
        deliver_due(now=back + timedelta(seconds=30))
        report_health(pipeline, {0: ([], Status.OK)}, at=back + timedelta(seconds=60))
        evaluate_all(now=back + timedelta(seconds=60))
        deliver_due(now=back + timedelta(seconds=60))
    finally:
        pagerduty.stop()

    events = pagerduty.bodies()
    assert [e["event_action"] for e in events] == ["trigger", "resolve"]
    assert events[0]["dedup_key"] == events[1]["dedup_key"] and events[0]["routing_key"] == ROUTING_KEY
    assert events[0]["payload"]["timestamp"] == now.isoformat()
    assert Channel.objects.get(name="oncall").last_success_at is not None
