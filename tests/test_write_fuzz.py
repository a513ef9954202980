"""Every write endpoint of the API (and the dead-letter and alert forms) fuzzed with the inputs that once
answered 500: deep nesting, NUL, lone surrogates, over-long strings, out-of-range numbers, unknown fields.
Each example starts from a valid body and breaks one value, so every answer must be a 4xx, never a 5xx,
and nothing may change but refusals in the action log. Bounded in examples: it runs in `make test-fast`."""
import json

import pytest
from django.core.cache import cache
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

from alerts.models import Alert, AlertRule, AlertState, Mute, RuleKind
from consumers.models import ActionLog, ActionResult, DeadLetter, PartitionOffset, Pipeline, TopicCheckJob
from tests.views_helpers import make_operator, make_pipeline

EXAMPLES = 12  # per endpoint: enough to meet each kind of bad value a few times, cheap enough for every run

# A valid body per write endpoint; each example breaks one value of it.
API_WRITES = {
    "/api/pipelines/orders/rewind": {"mode": "to-offset", "value": "5", "partitions": [0], "rollback_sink": False,
                                     "dry_run": True},
    "/api/pipelines/orders/actions/start": {},
    "/api/pipelines/orders/actions/stop": {},
    "/api/groups/billing/reset": {"topic": "billing-topic", "mode": "to-earliest", "execute": False},
    "/api/pipelines/orders/reconciliation": {"full": False},
    "/api/pipelines/orders/topic-checks": {},
    "/api/pipelines/orders/dead-letters/replay": {"ids": [1], "source": "stored"},
    "/api/pipelines/orders/dead-letters/discard": {"ids": [1], "reason": "probe"},
    "/api/pipelines/orders/dead-letters/discard#filter": {"filter": {"error": "x", "partition": 0}, "count": 1,
                                                          "reason": "probe"},
    "/api/alerts/ALERT/acknowledge/": {},
    "/api/alerts/ALERT/mute/": {"minutes": 10, "reason": "deploy"},
}
FORM_WRITES = {
    "/pipelines/orders/dead-letters/discard/": {"ids": "1", "reason": "probe", "offset_from": "0"},
    "/pipelines/orders/dead-letters/replay/": {"ids": "1", "partition": "1"},
    "/alerts/ALERT/mute/": {"minutes": "10", "reason": "deploy"},
}


def nested(depth: int):
    value = 1
    for level in range(depth):
        value = [value] if level % 2 else {"a": value}
    return value


text = st.text(max_size=20)
bad_strings = st.one_of(
    st.builds(lambda a, b: f"{a}\x00{b}", text, text),                     # NUL
    st.builds(lambda a, s, b: f"{a}{chr(s)}{b}", text, st.integers(0xD800, 0xDFFF), text),  # lone surrogate
    st.integers(2_001, 20_000).map(lambda n: "x" * n),                      # longer than any column
)
bad_values = st.one_of(
    bad_strings,
    st.integers(33, 200).map(nested),                                       # deeper than any body may be
    st.integers(1, 4).map(nested),                                          # the wrong type, shallow
    st.sampled_from([2**63, -(2**63) - 1, 10**30, -1, 1.5, True]),   # out of range or of type (null is valid)
)


class Raw(str):
    """A body sent as written: nesting deeper than the test's own json.dumps could encode."""


def encoded(body) -> str:
    return body if isinstance(body, Raw) else json.dumps(body)


# Deep enough for the interpreter's recursion limit: "[" * 100000 + "]" * 100000 was a RecursionError (a 500).
deep_texts = st.integers(1_000, 100_000).flatmap(lambda n: st.sampled_from([
    Raw("[" * n + "]" * n), Raw('{"a":' * n + "1" + "}" * n), Raw('{"mode": ' + "[" * n + "]" * n + "}")]))


def broken_body(base: dict):
    keys = st.sampled_from([*base, "extra", "\ud800", "a\x00b"]) if base else st.sampled_from(["extra", "\ud800"])
    return st.one_of(
        st.builds(lambda key, value: {**base, key: value}, keys, bad_values),
        bad_values.filter(lambda value: not isinstance(value, dict)),     # the whole body is not an object
        deep_texts,
    )


def broken_form(base: dict):
    """Forms: a known field gets a NUL or an over-long value (unknown fields are ignored by forms)."""
    form_bad = st.one_of(st.builds(lambda a: f"{a}\x00", text), st.integers(2_001, 20_000).map(lambda n: "9" * n))
    return st.builds(lambda key, value: {**base, key: value}, st.sampled_from(list(base)), form_bad)


def snapshot(pipeline, alert) -> dict:
    """Everything a write could change."""
    pipeline = Pipeline.objects.get(pk=pipeline.pk)
    alert = Alert.objects.get(pk=alert.pk)
    return {
        "offsets": sorted(PartitionOffset.objects.values_list("pipeline_id", "partition", "next_offset",
                                                              "replay_until")),
        "pipeline": (pipeline.desired_state, pipeline.epoch, pipeline.transform, pipeline.last_error),
        "dead_letters": sorted(DeadLetter.objects.values_list("pk", "discarded_at", "replay_attempts")),
        "alert": (alert.state, alert.acknowledged_at), "mutes": Mute.objects.count(),
        "topic_checks": TopicCheckJob.objects.count(), "tokens": Token.objects.count(),
        "actions": ActionLog.objects.exclude(result=ActionResult.REFUSED).count(),
    }


@pytest.fixture
def world(db):
    cache.clear()  # throttles count per user: the fuzzer must not meet them
    pipeline = make_pipeline()
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline)
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="3 lost",
                                 started_at=now, last_seen_at=now)
    from django.test import Client

    client = Client()
    client.force_login(make_operator())
    return client, pipeline, alert


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])


@pytest.mark.parametrize("endpoint", sorted(API_WRITES))
def test_no_broken_json_body_gets_a_5xx_or_changes_anything(world, monkeypatch, endpoint):
    client, pipeline, alert = world
    monkeypatch.setattr("rest_framework.throttling.SimpleRateThrottle.allow_request", lambda *args: True)
    url = endpoint.split("#")[0].replace("ALERT", str(alert.pk))
    before = snapshot(pipeline, alert)

    @FUZZ
    @given(body=broken_body(API_WRITES[endpoint]))
    def check(body):
        response = client.post(url, encoded(body), content_type="application/json")
        shown = body if len(repr(body)) < 300 else "(long)"
        assert 400 <= response.status_code < 500, (url, shown, response.content[:300])
        assert snapshot(pipeline, alert) == before

    check()


@pytest.mark.parametrize("endpoint", sorted(FORM_WRITES))
def test_no_broken_form_gets_a_5xx_or_changes_anything(world, endpoint):
    client, pipeline, alert = world
    url = endpoint.replace("ALERT", str(alert.pk))
    before = snapshot(pipeline, alert)

    @FUZZ
    @given(fields=broken_form(FORM_WRITES[endpoint]))
    def check(fields):
        response = client.post(url, fields)
        # The alert forms answer with a redirect and a message (no JavaScript needed); the others with a 4xx.
        assert response.status_code < 500 and not 200 <= response.status_code < 300, (url, response.status_code)
        assert snapshot(pipeline, alert) == before

    check()


def test_the_token_endpoint_takes_any_broken_body_without_a_5xx(db):
    from django.test import Client

    cache.clear()

    @FUZZ
    @given(body=broken_body({"username": "otto", "password": "x"}))
    def check(body):
        cache.clear()
        response = Client().post("/api/token", encoded(body), content_type="application/json")
        assert 400 <= response.status_code < 500, response.content[:300]
        assert not Token.objects.exists()

    check()
