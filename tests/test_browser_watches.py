"""Watches in a real browser after real history: a plain kafka-python consumer that commits before it writes is
SIGKILLed and restarted (it loses the records of the batch it died in); an operator adds a watch of its group with
the form, and after the scheduled check and lag samples sees the loss on the watch's page (status, partitions,
lag charts, the lost offsets), traces one lost record to its value and missing row, exports every finding as CSV,
and finds the watch on /watches/ and on the overview beside the pipelines. Saves a screenshot of the watch page
(to docs/screenshots/ with `make screenshots`)."""
import csv
import io
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from consumers.models import Watch
from consumers.reconciliation import snapshots, watch_audit
from tests.conftest import screenshot_dir
from tests.test_browser_dashboard import browser, log_in, page  # noqa: F401  (fixtures)
from tests.views_helpers import make_operator, make_pipeline
from tests.watch_helpers import id_counts, produce, read_topic, run_plain_consumer

pytestmark = [pytest.mark.browser, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def test_an_operator_watches_a_plain_consumer_that_lost_records_and_traces_one(page, live_server, make_topic,  # noqa: F811
                                                                              subprocess_env, table_name):
    topic = make_topic("nums", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 61)], partitions=2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write", die_at_batch=2) == -9
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write") == 0
    records, written = read_topic(topic), id_counts(table_name)
    lost = sorted(at for at, (_, value, _) in records.items() if int(value) not in written)
    assert lost, "the killed consumer lost the batch it had committed"
    make_pipeline("orders")   # a pipeline Tally runs, listed beside the watch

    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/watches/")
    page.locator("#add-watch").click()
    page.get_by_label("Name").fill("plain-nums")
    page.get_by_label("Group").fill(group)
    page.get_by_label("Topic").fill(topic)
    page.get_by_label("Sink table").fill(table_name)
    page.get_by_label("Record id").fill("value")
    page.get_by_label("Row id").fill("id")
    page.get_by_label("Settle seconds").fill("0")
    page.locator("#create-watch").click()
    expect(page).to_have_url(f"{live_server.url}/watches/plain-nums/")
    expect(page.locator("#no-snapshots")).to_be_visible()   # nothing checked or sampled yet

    watch = Watch.objects.get(name="plain-nums")
    now = timezone.now()
    for minutes in (0, 1, 2):   # what beat does: a check, then a lag sample, each minute
        watch_audit.check_watch(watch, now=now + timedelta(minutes=minutes))
        snapshots.take_snapshots(now=now + timedelta(minutes=minutes))
    page.reload()

    expect(page.get_by_role("heading", name="Watch plain-nums")).to_contain_text("ERR")
    expect(page.locator("#watch-summary [data-field=lost]")).to_have_text(str(len(lost)))
    expect(page.locator("#watch-partitions tbody tr")).to_have_count(2)
    for p in (0, 1):
        lost_here = sum(1 for q, _ in lost if q == p)
        expect(page.locator(f"#partition-{p} td").nth(9)).to_have_text(str(lost_here))
        expect(page.locator(f"#chart-lag-{p} canvas")).to_have_count(1)   # the lag history, drawn
        # uPlot's stylesheet lays the plot's overlay and legend out (without it the legend sits on the plot).
        expect(page.locator(f"#chart-lag-{p} .u-over")).to_have_css("position", "absolute")
    expect(page.locator("#no-snapshots")).to_have_count(0)
    links = page.locator("#lost-offsets a")
    expect(links).to_have_count(len(lost))
    page.screenshot(path=str(screenshot_dir() / "watch.png"), full_page=True)

    with page.expect_download() as download:
        page.locator("#findings-csv").click()
    exported = list(csv.DictReader(io.StringIO(open(download.value.path()).read())))
    assert [(int(r["partition"]), int(r["offset"]), r["kind"]) for r in exported] == \
        [(p, o, "lost") for p, o in lost]

    partition, offset = lost[0]
    value = records[(partition, offset)][1].decode()
    links.first.click()
    expect(page).to_have_url(f"{live_server.url}/watches/plain-nums/trace/?partition={partition}&offset={offset}")
    result = page.locator(f"#trace-{partition}-{offset}")
    expect(result.locator("[data-verdict]")).to_have_text("lost")
    expect(page.locator("#trace-record")).to_contain_text(value)
    expect(page.locator("#trace-expected")).to_have_text(f"id = {value}")
    expect(page.locator("#trace-rows [data-field=rows_found]")).to_have_text("0")
    delivered = next(at for at in sorted(records) if at not in lost)
    page.locator("#trace-partition").fill(str(delivered[0]))
    page.locator("#trace-offset").fill(str(delivered[1]))
    page.locator("#trace-submit").click()   # htmx swaps the result in place
    expect(page.locator(f"#trace-{delivered[0]}-{delivered[1]} [data-verdict]")).to_have_text("delivered")
    expect(page.locator("#trace-rows [data-field=rows_found]")).to_have_text("1")

    page.goto(f"{live_server.url}/watches/")
    row = page.locator("#watch-plain-nums")
    expect(row).to_have_attribute("data-status", "ERR")
    expect(row.locator("[data-field=lost]")).to_contain_text(str(len(lost)))
    page.goto(f"{live_server.url}/")
    expect(page.locator("#pipeline-orders")).to_be_visible()
    expect(page.locator("#watch-plain-nums")).to_contain_text(group)
    expect(page.locator("#watch-plain-nums [data-field=lost]")).to_contain_text(str(len(lost)))
