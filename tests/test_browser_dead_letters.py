"""The dead-letter page in a real browser: an operator opens it from the pipeline page, filters down to one dead
letter, replays it after the transform was fixed and sees the outcome; the sink then holds its row once.
Saves a screenshot of the page (to docs/screenshots/ with `make screenshots`)."""
import re

import pytest
from playwright.sync_api import expect

from consumers.models import DeadLetter, DeadLetterReplay
from tests.conftest import screenshot_dir
from tests.test_browser_dashboard import browser, log_in, page  # noqa: F401  (fixtures)
from tests.test_dead_letters import consume, fix_transform, pipeline, rows_in_provenance_order, values  # noqa: F401 (fixture)
from tests.views_helpers import make_operator

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_filters_and_replays_a_dead_letter_and_sees_its_outcome(page, live_server, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: values(10)})   # offsets 3 ("x3"), 7 ("7?") and 8 ("junk") become dead letters
    fix_transform(orders)              # the fixed transform reads "7?" as 7
    seven = DeadLetter.objects.get(offset=7)

    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/orders/")
    page.locator("#dead-letters-link").click()
    expect(page.get_by_role("heading", name="Dead letters")).to_be_visible()
    expect(page.locator("#dead-letter-table tbody tr")).to_have_count(3)

    page.get_by_label("Offset from").fill("5")
    page.get_by_label("to (inclusive)").fill("7")
    page.locator("#filter-submit").click()
    expect(page.locator("#dead-letter-table tbody tr")).to_have_count(1)
    expect(page).to_have_url(f"{live_server.url}/pipelines/orders/dead-letters/?error=&partition=&offset_from=5"
                             f"&offset_to=7&state=pending")
    row = page.locator(f"#dead-letter-{seven.pk}")
    expect(row).to_contain_text("7?")
    expect(row).to_contain_text("value is not an integer")
    screenshot = screenshot_dir() / "dead-letters.png"

    page.locator(f"#select-{seven.pk}").check()
    page.locator("#replay-selected").click()
    outcome = page.locator("#dead-letter-outcome")
    expect(outcome).to_contain_text("1 replayed into the sink")
    expect(outcome.locator("[data-result=replayed]")).to_have_text("replayed: 1")
    expect(page.locator("#dead-letter-table tbody")).to_contain_text("No dead letters match.")  # filters kept
    expect(page.locator("#pending-count")).to_have_text("(2 pending in all)")
    expect(page).to_have_url(re.compile(r"/pipelines/orders/dead-letters/\?"))  # htmx swapped the panel in place

    assert 7 in [o for _, o, _, _ in rows_in_provenance_order(orders)]
    assert list(DeadLetterReplay.objects.values_list("offset", "actor")) == [(7, "otto")]
    assert sorted(DeadLetter.objects.values_list("offset", flat=True)) == [3, 8]

    page.get_by_label("State").select_option("any")
    page.locator("#filter-submit").click()
    expect(page.locator(f"#dead-letter-{seven.pk}")).to_have_attribute("data-state", "replayed")
    expect(page.locator(f"#dead-letter-{seven.pk}")).to_contain_text("in the sink (1 row)")
    page.screenshot(path=str(screenshot), full_page=True)


def test_an_operator_replays_all_matching_dead_letters_across_pages_after_confirming(page, live_server, pipeline):  # noqa: F811
    orders = pipeline()
    consume(orders, {0: {o: f"x{o}" for o in range(120)}})   # 120 dead letters: three pages of 50
    fix_transform(orders)
    log_in(page, live_server, make_operator())
    page.goto(f"{live_server.url}/pipelines/orders/dead-letters/")
    expect(page.locator("#dead-letter-table tbody tr")).to_have_count(50)
    expect(page.locator("#select-all-matching-bar")).to_be_hidden()

    page.locator("#select-all").check()
    expect(page.locator("#select-all-matching-bar")).to_be_visible()
    page.locator("#select-all-matching").click()
    expect(page.locator("#all-matching-selected")).to_contain_text("All 120 matching dead letters are selected")
    page.locator("#replay-selected").click()
    confirm = page.locator("#confirm-all-matching")
    expect(confirm).to_contain_text("Replay all 120 pending dead letters that match the filters?")
    assert DeadLetter.objects.count() == 120 and not DeadLetterReplay.objects.exists()   # nothing before confirming
    page.evaluate("window.scrollTo(0, 0)")   # the confirmation under the filters, not the page's end
    page.screenshot(path=str(screenshot_dir() / "dead-letters-all-matching.png"), full_page=False)

    page.locator("#confirm-all-matching-button").click()
    outcome = page.locator("#dead-letter-batches-outcome")
    expect(outcome.locator("[data-result=replayed]")).to_have_text("replayed: 120")
    expect(page.locator("#dead-letter-table tbody")).to_contain_text("No dead letters match.")
    assert [o for _, o, _, _ in rows_in_provenance_order(orders)] == list(range(120))
    assert DeadLetterReplay.objects.count() == 120 and not DeadLetter.objects.exists()
