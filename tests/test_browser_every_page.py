"""Every page after the states Tally learnt lately (tests/new_states.py), in a real browser: an operator visits
each page and fragment that shows them, and each must load without a console error, a script error or a failed
request, with no id given twice and every control labelled (tests/page_checks.py). Where the server refuses (a
start or a rewind of a pipeline whose cluster's password file is gone), the page says why, in words."""
import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from consumers.models import TopicCheckJob
from consumers.models.topic_check import topic_check_lease
from tests.new_states import make_new_states
from tests.page_checks import POLLS_AFTER, PageChecks
from tests.producing import send
from tests.sink_rows import made_sink_table
from tests.test_browser_dashboard import browser, log_in, page  # noqa: F401  (fixtures)
from tests.views_helpers import make_operator, make_superuser, make_viewer

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def states(settings, tmp_path):
    return make_new_states(settings, tmp_path)


def visit(checks, url: str) -> None:
    checks.goto(url)
    checks.check(url)


def every_page(states) -> list[str]:
    alerted = states.acknowledged.pk
    return ["/", "/pipelines/orders/", "/pipelines/orders/rewind/", "/pipelines/orders/dead-letters/",
            "/pipelines/orders/trace/", "/topic-checks/", "/topic-checks/?pipeline=orders",
            f"/pipelines/{states.json_pipeline.name}/", f"/pipelines/{states.broken.name}/",
            f"/pipelines/{states.broken.name}/rewind/", "/pipelines/new/", "/watches/", "/watches/never/",
            "/watches/grown/", "/watches/never/trace/", "/alerts/?state=all",
            f"/alerts/?state=acknowledged&pipeline=orders#alert-{alerted}", "/alerts/rules/", "/alerts/channels/",
            "/alerts/channels/pager/", "/alerts/channels/chat/", "/action-log/", "/clusters/", "/groups/",
            "/alerts/rules/new/", "/watches/new/", "/api/docs/"]


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_every_page_after_the_new_states_loads_cleanly(page, live_server, states, role):  # noqa: F811
    checks = PageChecks(page)
    log_in(page, live_server, make_operator() if role == "operator" else make_viewer())
    for path in every_page(states):
        visit(checks, f"{live_server.url}{path}")


def test_the_admin_pages_of_the_new_states_load_cleanly(page, live_server, states):  # noqa: F811
    checks = PageChecks(page)
    log_in(page, live_server, make_superuser())
    failed = TopicCheckJob.objects.get(status="failed").pk
    for path in [f"/admin/alerts/alert/{states.acknowledged.pk}/change/",
                 f"/admin/alerts/alert/{states.noisy.pk}/change/", "/admin/alerts/alert/",
                 "/admin/alerts/notification/", "/admin/alerts/notification/?kind=acknowledged",
                 "/admin/alerts/channel/", "/admin/consumers/topiccheckjob/",
                 f"/admin/consumers/topiccheckjob/{failed}/change/", "/admin/consumers/pipeline/",
                 f"/admin/consumers/pipeline/{states.json_pipeline.pk}/change/",
                 f"/admin/consumers/pipeline/{states.broken.pk}/change/"]:
        visit(checks, f"{live_server.url}{path}")


def test_the_topic_checks_show_why_one_failed_and_how_far_one_has_run(page, live_server, states):  # noqa: F811
    checks = PageChecks(page)
    log_in(page, live_server, make_operator())
    visit(checks, f"{live_server.url}/pipelines/orders/")
    jobs = page.locator("#topic-check-jobs")
    expect(jobs).to_contain_text("its worker stopped answering")
    expect(jobs).to_contain_text("reading partition 1")
    expect(jobs).to_contain_text("queued")

    # The running check's worker goes silent past the lease, and the queued one is taken and fails the same way:
    # the open page's poll shows both failed, with why, and stops polling.
    running, queued = TopicCheckJob.objects.filter(status__in=("running", "queued")).order_by("created_at")
    later = timezone.now() + topic_check_lease() + timedelta(seconds=1)
    TopicCheckJob.objects.filter(pk=queued.pk).claim(later - topic_check_lease() - timedelta(seconds=1))
    assert TopicCheckJob.objects.fail_stale(later) == 2
    page.clock.run_for(POLLS_AFTER)
    for job in (running, queued):
        expect(page.locator(f"#topic-check-{job.pk}")).to_contain_text("its worker stopped answering")
        expect(page.locator(f"#topic-check-{job.pk} progress")).to_have_count(0)
    expect(jobs).not_to_have_attribute("hx-trigger", re.compile("every"))
    checks.check("the checks failed while the page was open")


def test_a_start_and_a_rewind_on_a_cluster_whose_password_file_is_gone_say_why(page, live_server, states):  # noqa: F811
    name = states.broken.name
    checks = PageChecks(page)
    log_in(page, live_server, make_operator())
    visit(checks, f"{live_server.url}/pipelines/{name}/")
    # Reconciled since the file went (ERR): the page says why before anyone presses a button.
    expect(page.locator("#pipeline-head h1")).to_contain_text("ERR")
    expect(page.locator("#pipeline-head")).to_contain_text("the SASL password cannot be read from file")
    checks.allow(f"/pipelines/{name}/actions/start/", 409)
    page.locator("#action-start").click()
    expect(page.locator("#action-outcome")).to_contain_text("the SASL password cannot be read from file")
    checks.check("start refused")

    visit(checks, f"{live_server.url}/pipelines/{name}/rewind/")
    page.locator("input[name=mode][value=to-earliest]").check()
    checks.allow(f"/pipelines/{name}/rewind/", 422)   # the form's refusal, as for bad input
    page.get_by_role("button", name="Preview (dry run)").click()
    expect(page.locator("#rewind-panel")).to_contain_text("the SASL password cannot be read from file")
    checks.check("rewind refused")

    visit(checks, f"{live_server.url}/pipelines/{name}/")
    page.locator("#topic-check-form").locator("xpath=..").locator("summary").click()
    page.get_by_role("button", name="Check with Spark").click()
    expect(page.locator("#action-outcome")).to_contain_text("The topic check was not requested")
    expect(page.locator("#action-outcome")).to_contain_text("the SASL password cannot be read from file")
    checks.check("topic check refused")

    visit(checks, f"{live_server.url}/pipelines/{name}/trace/")
    page.locator("#trace-partition").fill("0")
    page.locator("#trace-offset").fill("3")
    for status in (409, 422, 503):   # whichever the trace answers a refusal with: the page must say why
        checks.allow(f"/pipelines/{name}/trace/", status)
    page.locator("#trace-submit").click()
    expect(page.locator("#trace-error")).to_contain_text("the SASL password cannot be read from file")
    checks.check("trace refused")


@pytest.mark.kafka
def test_the_new_pipeline_preview_notes_epoch_seconds_read_as_milliseconds(page, live_server, states,  # noqa: F811
                                                                            make_topic):
    topic = make_topic("every-page-json")
    send(topic, [(None, None, json.dumps({"id": n, "created_at": 1_700_000_000 + n}).encode()) for n in range(5)])
    with made_sink_table("ep", "id bigint NOT NULL, created_at timestamptz") as table:
        checks = PageChecks(page)
        log_in(page, live_server, make_operator())
        visit(checks, f"{live_server.url}/pipelines/new/")
        page.get_by_label("Name", exact=True).fill("seconds-json")
        page.get_by_label("Topic", exact=True).fill(topic)
        page.get_by_label("Sink table", exact=True).fill(table)
        page.get_by_label("Transform", exact=True).fill("json")
        page.locator("#preview-pipeline").click()
        expect(page.locator("#preview-notes")).to_contain_text("map it as created_at=created_at::seconds")
        checks.check("preview with notes")
        page.get_by_label("Mapping (transform json)").fill("created_at=created_at::seconds")
        page.locator("#preview-pipeline").click()
        expect(page.locator("#preview-records tbody tr.preview-record")).to_have_count(5)
        expect(page.locator("#preview-notes")).to_have_count(0)
        expect(page.locator("#preview-records")).to_contain_text("2023-11-14")
        checks.check("preview in seconds")


def test_the_admin_refuses_a_start_and_a_rewind_on_a_cluster_whose_password_file_is_gone_saying_why(
        page, live_server, states):  # noqa: F811
    checks = PageChecks(page)
    log_in(page, live_server, make_superuser())
    for action in ("start", "rewind"):
        visit(checks, f"{live_server.url}/admin/consumers/pipeline/")
        page.locator(f"input[name=_selected_action][value='{states.broken.pk}']").check()
        page.locator("select[name=action]").select_option(action)
        page.locator("button[name=index]").click()
        if action == "rewind":
            page.locator("input[name=mode][value=to-earliest]").check()
            page.locator("#preview-rewind").click()
            expect(page.locator(".tally-refused").first).to_contain_text("the SASL password cannot be read from file")
        else:
            expect(page.locator(".messagelist")).to_contain_text("the SASL password cannot be read from file")
        checks.check(f"admin {action} refused")
