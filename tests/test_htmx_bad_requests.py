"""A 400 answered to an htmx request is swapped (base.html's htmx-config) and fits what asked for it: the filter's
or the page's own fragment with the reason, or, when the view cannot answer with the fragment asked for, the reason
in the page's #request-error region. Never a whole page inside an element."""
import json
import re

import pytest
from django.test import Client

from consumers.models import DeadLetter
from tests.views_helpers import make_operator, make_pipeline

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def client():
    client = Client()
    client.force_login(make_operator())
    return client


def htmx_config(html) -> list[dict]:
    return json.loads(re.search(r'<meta name="htmx-config" content=\'([^\']+)\'>', html).group(1))["responseHandling"]


def test_htmx_swaps_a_400_instead_of_dropping_it(client):
    rules = htmx_config(client.get("/action-log/").content.decode())
    first_match = next(rule for rule in rules if re.fullmatch(rule["code"], "400"))
    assert first_match == {"code": "400", "swap": True, "error": False}
    assert 'id="request-error"' in client.get("/action-log/").content.decode()


def test_an_unknown_pipeline_in_the_action_log_filter_answers_the_entries_fragment_with_the_reason(client):
    response = client.get("/action-log/", {"pipeline": "nope"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 400 and "<html" not in html
    assert html.strip().startswith('<div id="action-log-entries">')  # the filter's hx-target, swapped outerHTML
    assert "No pipeline named &#x27;nope&#x27;, now or deleted" in html and 'id="filter-error"' in html


def test_an_unknown_state_in_the_alerts_filter_answers_the_table_fragment_with_the_reason(client):
    response = client.get("/alerts/", {"state": "bogus"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 400 and "<html" not in html
    assert html.strip().startswith('<div id="alert-table"') and 'id="filter-error"' in html
    assert "bogus" in html


def test_a_dead_letter_page_past_the_end_answers_the_panel_with_the_reason(client):
    pipeline = make_pipeline()
    DeadLetter.objects.create(pipeline=pipeline, partition=0, offset=1, value=b"x", error="BadRecord")
    response = client.get(f"/pipelines/{pipeline.name}/dead-letters/", {"page": "7"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 400 and "<html" not in html and "<form" not in html
    assert 'id="dead-letter-error"' in html and "There is no page 7: pages are numbered 1 to 1." in html


def test_an_unknown_chart_range_asked_by_htmx_goes_to_the_request_error_region_not_into_the_target(client):
    pipeline = make_pipeline()
    response = client.get(f"/pipelines/{pipeline.name}/", {"range": "bogus"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 400 and "<html" not in html
    assert response["HX-Retarget"] == "#request-error" and response["HX-Reswap"] == "innerHTML"
    assert html == ('<p class="flash flash-error" role="alert">'
                    'Unknown range &#x27;bogus&#x27;: choose one of 15m, 1h, 24h.</p>')
    # Its polled fragments ignore the range, and a full page load still shows the whole page with the reason.
    assert client.get(f"/pipelines/{pipeline.name}/", {"range": "bogus", "fragment": "live"}, **HTMX).status_code == 200
    assert "<html" in client.get(f"/pipelines/{pipeline.name}/", {"range": "bogus"}).content.decode()


def test_a_nul_character_in_an_htmx_request_goes_to_the_request_error_region(client):
    response = client.get("/action-log/", {"pipeline": "a\x00b"}, **HTMX)
    assert response.status_code == 400 and response["HX-Retarget"] == "#request-error"
    assert 'role="alert">The request holds a NUL character' in response.content.decode()
    plain = client.get("/action-log/", {"pipeline": "a\x00b"})
    assert plain.status_code == 400 and plain["Content-Type"].startswith("text/plain")
