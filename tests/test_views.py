"""Dashboard pages: login, roles, the live fragment, CSRF, and bad form input (clear errors, no change)."""
import re

import pytest
from django.core.management import call_command
from django.test import Client

from consumers.models import ActionLog, DesiredState, PartitionOffset, Pipeline
from tests.views_helpers import make_operator, make_pipeline, make_viewer

pytestmark = pytest.mark.django_db

PAGES = ["/", "/pipelines/orders/", "/pipelines/orders/rewind/", "/action-log/", "/demo/", "/groups/"]


@pytest.fixture
def pipeline():
    return make_pipeline()


@pytest.mark.parametrize("url", PAGES)
def test_every_page_redirects_an_anonymous_visitor_to_login(client, pipeline, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_the_overview_shows_each_pipeline_with_status_text_lag_and_counts(viewer_client, pipeline):
    make_pipeline("payments", lost=3, status="ERR")
    html = viewer_client.get("/").content.decode()
    assert 'href="/pipelines/orders/"' in html and 'href="/pipelines/payments/"' in html
    payments = re.search(r'<tr id="pipeline-payments".*?</tr>', html, re.S).group(0)
    assert "ERR" in payments and "badge-err" in payments  # text as well as colour
    assert re.search(r'data-field="lost">⚠ 3<', payments)
    orders = re.search(r'<tr id="pipeline-orders".*?</tr>', html, re.S).group(0)
    assert re.search(r'data-field="lag_records">40<', orders)
    assert "12.5 s" in orders and "42.0/s" in orders


def test_the_overview_polls_a_fragment_that_htmx_gets_from_the_same_url(viewer_client, pipeline):
    page = viewer_client.get("/")
    assert 'hx-get="/" hx-trigger="every 2s"' in page.content.decode()
    fragment = viewer_client.get("/", HTTP_HX_REQUEST="true")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<div id="overview-live"')
    assert "<html" not in body and "pipeline-orders" in body
    assert "HX-Request" in fragment["Vary"] and "HX-Request" in page["Vary"]


def test_the_overview_fragment_shows_new_numbers_after_reconciliation_changes_them(viewer_client, pipeline):
    pipeline.health.lag_records = 777
    pipeline.health.save()
    body = viewer_client.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-field="lag_records">777<' in body


def test_the_overview_counts_a_reconciled_pipeline_that_has_no_partition_yet(viewer_client, pipeline):
    pipeline.partition_health.all().delete()    # never started: reconciliation found no position to check
    html = viewer_client.get("/").content.decode()
    assert "Last reconciliation: never" not in html
    assert re.search(r'Last reconciliation: <time datetime="[^"]+" id="last-check">', html)


def test_the_pipeline_page_shows_partitions_timeline_dead_letters_and_runs(viewer_client, pipeline):
    html = viewer_client.get("/pipelines/orders/").content.decode()
    row = re.search(r'<tr id="partition-0">.*?</tr>', html, re.S).group(0)
    assert [int(n) for n in re.findall(r'<td class="num">(\d+)', row)][:5] == [0, 120, 100, 100, 20]
    timeline = re.search(r'<figure class="timeline" id="timeline-0">.*?</figure>', html, re.S).group(0)
    assert "gaps: 40–49" in timeline and "overlaps: 60–64" in timeline and "rewinds to 80" in timeline
    assert 'class="gap"' in timeline and 'class="overlap"' in timeline and 'class="rewind"' in timeline
    assert "continuous" in re.search(r'id="timeline-1">.*?</figure>', html, re.S).group(0)
    assert "not-a-number" in html and "value is not an integer" in html
    assert "worker-a:4242" in html
    assert '"lag_records": [100, 90, 80, 70, 60, 50, 40, 30, 20, 10]' in html  # chart data, oldest first


def test_a_viewer_sees_no_action_buttons_and_is_told_why(viewer_client, pipeline):
    html = viewer_client.get("/pipelines/orders/").content.decode()
    assert 'id="viewer-note"' in html and "only operators can" in html
    assert "/actions/start/" not in html and 'id="rewind-link"' not in html


def test_a_viewer_posting_an_action_gets_403_nothing_changes_and_the_refusal_is_audited(viewer_client, pipeline):
    epoch = pipeline.epoch
    response = viewer_client.post("/pipelines/orders/actions/start/")
    assert response.status_code == 403
    assert "only operators can" in response.content.decode()
    pipeline.refresh_from_db()
    assert (pipeline.desired_state, pipeline.epoch) == (DesiredState.STOPPED, epoch)
    refusal = ActionLog.objects.get()
    assert (refusal.pipeline, refusal.action, refusal.result) == (pipeline, "start", "refused")
    assert refusal.actor == "vera" and "viewer role" in refusal.message


def test_a_viewer_cannot_rewind(viewer_client, pipeline):
    response = viewer_client.post("/pipelines/orders/rewind/", {"mode": "to-earliest", "step": "execute"})
    assert response.status_code == 403
    assert list(PartitionOffset.objects.values_list("next_offset", flat=True)) == [100, 100]


def test_an_operator_can_start_a_pipeline_and_sees_the_outcome_in_the_fragment(operator_client, pipeline):
    response = operator_client.post("/pipelines/orders/actions/start/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="action-outcome"') and "desired state running" in body
    pipeline.refresh_from_db()
    assert pipeline.desired_state == DesiredState.RUNNING
    assert ActionLog.objects.get().actor == "otto"


def test_a_refused_action_shows_why(operator_client, pipeline):
    response = operator_client.post("/pipelines/orders/actions/pause/", follow=True)
    assert "Cannot pause pipeline &#x27;orders&#x27;: it is not running" in response.content.decode()
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED


def test_an_action_on_an_unknown_verb_or_pipeline_is_a_404_logged_as_refused_like_the_apis(operator_client, pipeline):
    assert operator_client.post("/pipelines/orders/actions/explode/").status_code == 404
    assert operator_client.post("/pipelines/nosuch/actions/start/", HTTP_HX_REQUEST="true").status_code == 404
    refusals = ActionLog.objects.order_by("pk")
    assert [(r.action, r.pipeline, r.result, r.params["path"]) for r in refusals] == [
        ("explode", pipeline, "refused", "/pipelines/orders/actions/explode/"),
        ("start", None, "refused", "/pipelines/nosuch/actions/start/")]
    assert "not found: Unknown action 'explode'" in refusals[0].message
    assert "not found: No pipeline named 'nosuch'" in refusals[1].message
    unchanged = Pipeline.objects.get()
    assert (unchanged.desired_state, unchanged.epoch) == (DesiredState.STOPPED, pipeline.epoch)


def test_csrf_is_enforced_on_actions(pipeline):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())
    assert client.post("/pipelines/orders/actions/start/").status_code == 403
    assert Pipeline.objects.get().desired_state == DesiredState.STOPPED
    page = client.get("/pipelines/orders/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    assert client.post("/pipelines/orders/actions/start/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert Pipeline.objects.get().desired_state == DesiredState.RUNNING


def test_csrf_is_enforced_on_the_rewind_form(pipeline):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_operator())
    response = client.post("/pipelines/orders/rewind/", {"mode": "to-earliest", "step": "execute"})
    assert response.status_code == 403
    assert list(PartitionOffset.objects.values_list("next_offset", flat=True)) == [100, 100]


@pytest.mark.parametrize("data, field, message", [
    ({"mode": "to-offset", "value": "abc"}, "value", "to-offset needs an integer, got &#x27;abc&#x27;"),
    ({"mode": "to-offset", "value": ""}, "value", "to-offset needs a value"),
    ({"mode": "shift-by", "value": "-10", "partitions": "zero"}, "partitions", "Partitions are numbers"),
    ({"mode": "to-datetime", "value": "2999-01-01T00:00:00Z"}, "value", "is in the future"),
    ({"mode": "by-duration", "value": "yesterday"}, "value", "by-duration"),
    ({"mode": "to-somewhere"}, "mode", "Select a valid choice"),
])
def test_bad_rewind_input_gives_a_clear_error_and_changes_nothing(operator_client, pipeline, data, field, message):
    response = operator_client.post("/pipelines/orders/rewind/", {**data, "step": "execute"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 422
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="rewind-panel"')
    assert message in body
    assert list(PartitionOffset.objects.values_list("next_offset", flat=True)) == [100, 100]
    refusal = ActionLog.objects.get()  # the refusal is audited, and nothing else happened
    assert (refusal.action, refusal.result, refusal.actor) == ("rewind", "refused", "otto")
    assert refusal.message.startswith(f"bad input: {field}:")


def test_the_action_log_lists_actions_and_filters_by_pipeline(operator_client, pipeline):
    make_pipeline("payments")
    operator_client.post("/pipelines/orders/actions/start/")
    operator_client.post("/pipelines/payments/actions/pause/")
    everything = operator_client.get("/action-log/").content.decode()
    assert "start" in everything and "refused" in everything
    only_orders = operator_client.get("/action-log/?pipeline=orders", HTTP_HX_REQUEST="true").content.decode()
    assert only_orders.lstrip().startswith('<div id="action-log-entries"')
    assert "/pipelines/orders/" in only_orders and "/pipelines/payments/" not in only_orders


@pytest.mark.parametrize("url", ["/action-log/?pipeline=orders", "/alerts/?state=all",
                                 "/pipelines/orders/dead-letters/?page=1", "/pipelines/orders/trace/"])
def test_a_history_restore_of_a_filtered_page_gets_the_whole_page(viewer_client, pipeline, url):
    """Filters push their URL (hx-push-url); going back to one htmx no longer caches, htmx asks for it again with
    HX-Request and HX-History-Restore-Request and swaps the answer into the body: a fragment would be all that is
    left of the page."""
    fragment = viewer_client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment  # the filter's own request: its fragment
    restored = viewer_client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    html = restored.content.decode()
    assert "<html" in html and '<nav' in html, html[:300]


def test_setup_roles_gives_operators_and_only_operators_the_operate_permission(db):
    call_command("setup_roles", verbosity=0)
    viewer, operator = make_viewer(), make_operator()
    assert operator.has_perm("consumers.operate_pipeline")
    assert not viewer.has_perm("consumers.operate_pipeline")
    assert viewer.has_perm("consumers.view_partitionoffset")


def test_the_admin_shows_offsets_and_ledger_read_only(admin_client, pipeline):
    offset = PartitionOffset.objects.first()
    assert admin_client.get("/admin/consumers/partitionoffset/").status_code == 200
    assert admin_client.get("/admin/consumers/partitionoffset/add/").status_code == 403
    detail = admin_client.get(f"/admin/consumers/partitionoffset/{offset.pk}/change/").content.decode()
    assert 'name="next_offset"' not in detail  # shown, not editable
    deleted = admin_client.post(f"/admin/consumers/partitionoffset/{offset.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    assert admin_client.get("/admin/consumers/batchledger/add/").status_code == 403
    assert PartitionOffset.objects.count() == 2


def test_the_base_layout_links_every_area_and_loads_only_local_assets(viewer_client, pipeline):
    html = viewer_client.get("/").content.decode()
    for href in ('href="/groups/"', 'href="/demo/"', 'href="/action-log/"', 'href="/alerts/"'):
        assert href in html
    assert not re.search(r'(src|href)="https?://', html)
    assert "vera · viewer" in html


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_group_page_shows_lag_and_resets_offsets_after_a_dry_run(kafka_bootstrap, make_topic):
    from consumers.kafka import admin as kafka_admin
    from tests.views_helpers import produce

    client = Client()
    client.force_login(make_operator())
    topic = make_topic("page-group")
    produce(kafka_bootstrap, topic, range(12))
    kafka_admin.commit_offsets("reports-job", topic, {0: 4})
    page = client.get("/groups/reports-job/").content.decode()
    row = re.search(r'<table class="striped" id="group-partitions">.*?</table>', page, re.S).group(0)
    assert re.findall(r'<td class="num">([^<]+)</td>', row)[:5] == ["0", "0", "12", "4", "8"]
    bad = client.post("/groups/reports-job/reset/", {"topic": topic, "mode": "to-offset", "value": "99",
                                                     "step": "execute"})
    assert bad.status_code == 422 and "outside [0, 12]" in bad.content.decode()
    preview = client.post("/groups/reports-job/reset/", {"topic": topic, "mode": "to-earliest", "step": "preview"})
    assert 'id="confirm-reset"' in preview.content.decode()
    assert kafka_admin.committed_offsets("reports-job", topic) == {0: 4}
    client.post("/groups/reports-job/reset/", {"topic": topic, "mode": "to-earliest", "value": "", "step": "execute"})
    assert kafka_admin.committed_offsets("reports-job", topic) == {0: 0}


def test_an_operator_requests_a_topic_check_of_a_pipeline_and_a_viewer_cannot(operator_client, pipeline):
    from consumers.models import TopicCheckJob

    form = {"pipeline": "orders", "next": "/pipelines/orders/"}
    unknown = operator_client.post("/topic-checks/request/", {**form, "pipeline": "nope"}, follow=True)
    assert "The topic check was not requested: pipeline: no such pipeline" in unknown.content.decode()
    assert not TopicCheckJob.objects.exists()
    # A table or column in the request is ignored: what is read comes from the pipeline's definition.
    done = operator_client.post("/topic-checks/request/", {**form, "table": "auth_user", "key_column": "password"},
                                follow=True)
    job = TopicCheckJob.objects.get()
    assert (job.table, job.key_column, job.value_parser) == ("sink_orders", "id", "int_value")
    assert (job.requested_by, job.pipeline) == ("otto", pipeline)
    assert f"Topic check #{job.pk} queued" in done.content.decode()

    viewer = Client()
    viewer.force_login(make_viewer())
    assert viewer.post("/topic-checks/request/", form).status_code == 403
    assert TopicCheckJob.objects.count() == 1
    assert ActionLog.objects.filter(action="topic_check", result="refused", pipeline=pipeline).count() == 1


def test_topic_check_results_show_on_the_pipeline_page_and_poll_while_running(viewer_client, pipeline):
    from consumers.models import TopicCheckJob

    TopicCheckJob.objects.create(pipeline=pipeline, topic="orders-topic", group_id="orders", table="sink_orders",
                                 key_column="id", status="done", progress=1.0,
                                 result={"records_read": 100, "missing_count": 2, "duplicated_count": 1,
                                         "extra_rows": 1, "missing": [41, 42], "duplicated": {"7": 2}})
    html = viewer_client.get("/pipelines/orders/").content.decode()
    jobs = re.search(r'<div id="topic-check-jobs".*?</table>', html, re.S).group(0)
    assert "hx-trigger" not in jobs.split(">")[0]  # nothing running: no polling
    assert "⚠ 2" in jobs and "missing: 41, 42" in jobs and "7×2" in jobs
    TopicCheckJob.objects.create(pipeline=pipeline, topic="orders-topic", group_id="orders", table="sink_orders",
                                 key_column="id", status="running", progress=0.4,
                                 progress_message="reading 100 records")
    fragment = viewer_client.get("/topic-checks/?pipeline=orders", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.lstrip().startswith('<div id="topic-check-jobs" hx-get=') and "reading 100 records" in fragment


def test_the_topic_checks_page_without_a_pipeline_lists_the_latest_checks_of_every_pipeline(viewer_client, pipeline):
    # It said "No topic check yet" whatever the checks: only ?pipeline=NAME listed any.
    from consumers.models import TopicCheckJob

    payments = make_pipeline("payments", topic="payments-topic")
    older = TopicCheckJob.objects.create(pipeline=pipeline, topic="orders-topic", group_id="orders",
                                         table="sink_orders", key_column="id", status="done", progress=1.0,
                                         result={"records_read": 10, "missing_count": 0, "duplicated_count": 0})
    newer = TopicCheckJob.objects.create(pipeline=payments, topic="payments-topic", group_id="payments",
                                         table="sink_payments", key_column="id", status="running", progress=0.5,
                                         progress_message="reading partition 1")

    every = viewer_client.get("/topic-checks/")
    orders = viewer_client.get("/topic-checks/?pipeline=orders")
    unknown = viewer_client.get("/topic-checks/?pipeline=nosuch")

    assert every.status_code == 200 and [j.pk for j in every.context["topic_checks"]] == [newer.pk, older.pk]
    assert "No topic check yet" not in every.content.decode()
    assert "of every pipeline" in every.content.decode()
    assert [j.pk for j in orders.context["topic_checks"]] == [older.pk]
    assert unknown.status_code == 404 and "No pipeline named 'nosuch'" in unknown.content.decode()


def test_the_demo_page_refuses_viewers_bad_input_and_a_second_run(operator_client, settings):
    from consumers.demo import runs as demo_runs
    from tests.conftest import TEST_REDIS_URL

    settings.REDIS_URL = TEST_REDIS_URL
    client = demo_runs._redis()
    client.delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)
    try:
        viewer = Client()
        viewer.force_login(make_viewer())
        assert viewer.post("/demo/run/", {"records": 100, "crash_probability": 0.2}).status_code == 403
        bad = operator_client.post("/demo/run/", {"records": "lots", "crash_probability": 0.2}, follow=True)
        assert "Records must be 1–10,000" in bad.content.decode()
        client.set(demo_runs.LOCK_KEY, "another-run")
        busy = operator_client.post("/demo/run/", {"records": 100, "crash_probability": 0.2}, follow=True)
        assert "A demo run is already in progress" in busy.content.decode()
        assert demo_runs.read_state() is None  # nothing was queued
    finally:
        client.delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)


def test_the_timeline_draws_batches_that_crossed_holes_apart_from_gaps(viewer_client, pipeline):
    from consumers.models import BatchLedger

    # Two batches on a transactional log after the fixture's [0, 100): 5 records and a marker each.
    for first in (100, 106):
        BatchLedger.objects.create(pipeline=pipeline, partition=1, first_offset=first, end_offset=first + 6,
                                   records=5, rows_written=5, epoch=1)
    html = viewer_client.get("/pipelines/orders/").content.decode()
    timeline = re.search(r'id="timeline-1">.*?</figure>', html, re.S).group(0)
    assert 'class="hole"' in timeline and "2 holes (markers" in timeline
    assert "batches 100–112 crossed holes" in timeline and 'class="gap"' not in timeline


def test_a_checkbox_help_is_its_own_line_and_describes_the_checkbox(operator_client):
    html = operator_client.get("/watches/new/").content.decode()
    assert re.search(r'<input type="checkbox" name="keyed"[^>]*aria-describedby="id_keyed_helptext"', html)
    label = re.search(r'<label for="id_keyed">.*?</label>', html, re.S).group(0)
    assert "<small" not in label   # inside the label, the stylesheet drew it over the label's text
    assert '<small class="muted checkbox-help" id="id_keyed_helptext">An update stream' in html


def test_a_viewers_refused_page_write_is_logged_under_the_action_its_success_is_logged_under(viewer_client):
    writes = [("/pipelines/new/", "create"), ("/watches/new/", "create_watch"), ("/groups/g/reset/", "reset_group")]
    for url, _ in writes:
        assert viewer_client.post(url, {"name": "x"}).status_code == 403, url
    assert list(ActionLog.objects.order_by("pk").values_list("action", "result")) == [
        (action, "refused") for _, action in writes]


def test_a_group_id_no_url_can_hold_is_shown_as_text_not_a_500(viewer_client):
    """A viewer's refused reset of "evil\\ngroup" is stored as asked: every page that lists it must still draw."""
    from django.contrib.auth.models import User

    viewer_client.post("/admin/consumers/groups/reset/", {"group": "evil\ngroup", "step": "execute"})
    ActionLog.objects.create(action="reset_group", actor="cli", group_id="evil\ngroup", result="refused")
    assert ActionLog.objects.filter(group_id="evil\ngroup").exists()
    page = viewer_client.get("/action-log/")
    assert page.status_code == 200 and "evil\ngroup" in page.content.decode()
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@example.com", "pw-root-123"))
    assert admin.get("/admin/consumers/actionlog/").status_code == 200
    assert admin.get("/admin/consumers/actionlog/", {"q": "evil"}).status_code == 200
    assert admin.post("/admin/consumers/groups/reset/", {"group": "evil\ngroup"}).status_code == 200
