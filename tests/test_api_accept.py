"""The API answers the media types its schema documents when a client names them in Accept: a watch's findings as
text/csv; an Accept no answer of a path can meet is a documented 406 (dashboard/api/renderers.py)."""
import csv
import io

import pytest
from django.test import Client

from consumers.models import Watch
from tests.api_schema import assert_documented, body, operation
from tests.views_helpers import make_operator

pytestmark = pytest.mark.django_db
CSV_PATH = "/api/watches/{name}/findings.csv"


@pytest.fixture
def operator():
    client = Client()
    client.force_login(make_operator())
    return client


@pytest.mark.parametrize("accept", ["text/csv", "text/csv; charset=utf-8", "application/json", "*/*"])
def test_a_watchs_findings_are_given_as_csv_to_a_client_that_accepts_csv(operator, accept):
    Watch.objects.create(name="billing", group_id="billing-loader", topic="billing")
    response = operator.get("/api/watches/billing/findings.csv", headers={"Accept": accept})
    assert response.status_code == 200, body(response)[:300]
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(body(response).decode())))
    assert rows == [["partition", "offset", "kind", "extra_rows", "checked_at"]]
    assert_documented(operation("GET", CSV_PATH), response, "GET", "/api/watches/billing/findings.csv")


def test_a_refusal_to_a_client_that_accepts_only_csv_is_csv_too(operator):
    response = operator.get("/api/watches/nobody/findings.csv", headers={"Accept": "text/csv"})
    assert response.status_code == 404
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert list(csv.reader(io.StringIO(response.content.decode())))[0] == ["detail"]


@pytest.mark.parametrize("path, template", [("/api/pipelines/", "/api/pipelines/"),
                                            ("/api/watches/billing/findings.csv", CSV_PATH)])
def test_an_accept_no_answer_meets_is_a_documented_406_in_json(operator, path, template):
    Watch.objects.create(name="billing", group_id="billing-loader", topic="billing")
    response = operator.get(path, headers={"Accept": "application/xml"})
    assert response.status_code == 406
    assert response.json() == {"detail": 'Could not satisfy the request Accept header.'}
    assert_documented(operation("GET", template), response, "GET", path)
