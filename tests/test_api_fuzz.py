"""The API fuzzed from its own OpenAPI schema (schemathesis), once per role: anonymous, viewer, operator; the
alerts API on a real alert.
Whatever the generated paths, queries and bodies: never a 500, an answer the schema documents (status and
shape), never a 2xx where the role must be refused, and never a moved offset (the fuzzer cannot reach Kafka, so
no write may get past validation either).

The operator gets every phase: the schema's examples, the boundary cases of each parameter and body field
(coverage) and random cases (fuzzing). An anonymous or viewer request is refused before its query or body is
read, except a viewer's read, which runs the operator's code: for them the fuzzing phase checks the refusals,
and the coverage phase's boundary cases would only repeat the operator's (the anonymous and viewer tests were
60 % of this module's time, nearly all of it in that phase)."""
import json
from urllib.parse import urlencode

import pytest
import schemathesis
from django.test import Client
from hypothesis import HealthCheck, settings
from rest_framework.throttling import SimpleRateThrottle
from schemathesis.config import SchemathesisConfig

from alerts.models import Mute
from consumers.models import PartitionOffset, Pipeline
from tests.alert_rows import open_alert
from tests.api_schema import RAW_SCHEMA, SCHEMA, assert_documented
from tests.views_helpers import make_operator, make_pipeline, make_viewer

# Built in-process (the served copy needs a login): the same generator /api/schema/ uses.
schema = SCHEMA
without_coverage = schemathesis.openapi.from_dict(
    RAW_SCHEMA, config=SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}}))

# Endpoints whose every method is for operators only when it writes.
WRITES = ("POST", "PUT", "PATCH", "DELETE")
PUBLIC = {"/api/token"}  # signs in: anonymous by design


pytestmark = [pytest.mark.kafka]  # the real broker: group and rewind endpoints read Kafka


@pytest.fixture
def unthrottled(monkeypatch, kafka_bootstrap):
    # Throttling has its own test; here it would turn the fuzzer's requests into 429s.
    monkeypatch.setattr(SimpleRateThrottle, "allow_request", lambda self, request, view: True)


def client_for(role: str) -> Client:
    from django.contrib.auth.models import User

    client = Client()
    if role != "anonymous":
        name = {"viewer": "vera", "operator": "otto"}[role]
        user = User.objects.filter(username=name).first() or (make_viewer if role == "viewer" else make_operator)()
        client.force_login(user)
    return client


@pytest.fixture
def clients(db):
    """A role's client, signed in once for all of a test's examples (signing in for each example took a third of
    the fuzz's time), as a real client keeps its session between requests."""
    made: dict[str, Client] = {}

    def client(role: str) -> Client:
        if role not in made:
            made[role] = client_for(role)
        return made[role]
    return client


def send(client: Client, case):
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    path = kwargs["url"].removeprefix("http://testserver")
    body = kwargs.get("json")
    data = json.dumps(body) if "json" in kwargs else kwargs.get("data", "")
    query = urlencode(kwargs.get("params") or {}, doseq=True)  # percent-encoded, as a real client sends it
    return client.generic(kwargs["method"], f"{path}?{query}" if query else path, data=data,
                          content_type="application/json")


FUZZ_SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much,
                                                HealthCheck.too_slow])


@schema.parametrize()
@FUZZ_SETTINGS
def test_an_operator_gets_no_500_and_moves_no_offset(unthrottled, clients, case):
    check_answer(clients("operator"), "operator", case)


@pytest.mark.parametrize("role", ["anonymous", "viewer"])
@without_coverage.parametrize()
@FUZZ_SETTINGS
def test_no_role_gets_a_500_or_more_than_its_role_allows(unthrottled, clients, role, case):
    check_answer(clients(role), role, case)


def check_answer(client: Client, role: str, case) -> None:
    pipeline = Pipeline.objects.filter(name="orders").first() or make_pipeline("orders", with_history=False)
    before = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    if "alert_id" in (case.path_parameters or {}):
        # The alerts API: on a real alert, else every generated id is a 404 and nothing behind it is reached.
        case.path_parameters["alert_id"] = open_alert(pipeline).pk
    muted_before = Mute.objects.count()
    response = send(client, case)
    # 503 is an outage said plainly (a JSON error); 500 is a crash.
    assert response.status_code < 500 or response.status_code == 503 and b'"error"' in response.content, (
        case.method, case.formatted_path, case.body, response.content[:500])
    if case.method.upper() == case.operation.method.upper():
        # Whatever it is, the answer is one the schema documents, in status and shape.
        assert_documented(case.operation, response, case.method, case.formatted_path)
    else:  # a method the path does not take: refused (by role first, then as a method), or described (OPTIONS)
        allowed = (403, 405, 200) if case.method.upper() == "OPTIONS" else (403, 405)
        assert response.status_code in allowed, (case.method, case.formatted_path, response.status_code)
    refused = role == "anonymous" and case.path not in PUBLIC or role == "viewer" and case.method.upper() in WRITES
    if refused:
        assert not 200 <= response.status_code < 300, (role, case.method, case.formatted_path, response.status_code)
    after = dict(PartitionOffset.objects.filter(pipeline=pipeline).values_list("partition", "next_offset"))
    assert after == before
    if not 200 <= response.status_code < 300:  # a refused request changes nothing, on the alerts API too
        assert Mute.objects.count() == muted_before
