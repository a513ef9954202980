"""Every write endpoint of the API and every HTML form door fuzzed with the inputs that once answered 500:
deep nesting, NUL, lone surrogates, over-long strings, out-of-range numbers, unknown fields. Each example starts
from a valid body and breaks one value, so every answer must be a 4xx (forms: a 4xx, or a redirect with an
error message), never a 5xx, and nothing may change but refusals in the action log. Kafka is not there: a body
that passed every other check would be refused at its topic check. Bounded in examples: it runs in `make test`
and `make test-fast`."""
import json
from urllib.parse import urlencode

import pytest
from django.core.cache import cache
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from knox.models import AuthToken

from alerts.models import Alert, AlertRule, AlertState, Channel, Mute, RuleKind
from consumers.models import ActionLog, ActionResult, DeadLetter, PartitionOffset, Pipeline, TopicCheckJob, Watch
from tests.views_helpers import make_operator, make_pipeline

EXAMPLES = 12  # per endpoint: enough to meet each kind of bad value a few times, cheap enough for every run

# A valid body per write endpoint; each example breaks one value of it.
API_WRITES = {
    "/api/pipelines/": {"name": "fresh", "topic": "orders-topic", "sink_table": "sink_fresh", "create_table": True},
    "/api/pipelines/preview": {"name": "fresh", "topic": "orders-topic", "sink_table": "sink_fresh",
                               "transform": "json"},
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
    "/api/watches/": {"name": "fresh-watch", "group": "fresh-group", "topic": "orders-topic"},
    "/api/alerts/ALERT/acknowledge/": {},
    "/api/alerts/ALERT/mute/": {"minutes": 10, "reason": "deploy"},
    "/api/alerts/channels/": {"name": "ops", "kind": "webhook", "url": "https://hooks.example.com/tally"},
}
# Keys whose broken values include valid ones (`enabled: true` is a fine channel): not broken.
VALID_ANYWAY = {"/api/alerts/channels/": {"enabled"}}
# The form doors: a valid form and the fields broken one at a time (a checkbox takes any value as "on", and a
# form ignores unknown fields, so those are not bad input). The rewind and group reset forms ask to execute.
FORM_WRITES = {
    "/pipelines/new/": ({"name": "fresh", "topic": "orders-topic", "sink_table": "sink_fresh",
                         "mode": "exactly-once", "transform": "int_value", "group": "", "engine": "python",
                         "isolation_level": "read_committed", "on_log_truncated": "stop", "runs": "1",
                         "create_table": "on", "map": "", "upsert_key": ""},
                        ("name", "topic", "sink_table", "mode", "transform", "group", "engine", "isolation_level",
                         "on_log_truncated", "runs", "map", "upsert_key")),
    "/pipelines/orders/rewind/": ({"mode": "to-offset", "value": "5", "partitions": "0", "step": "execute"},
                                  ("mode", "value", "partitions")),
    "/groups/billing/reset/": ({"topic": "billing-topic", "mode": "to-offset", "value": "5", "partitions": "0",
                                "step": "execute"}, ("topic", "mode", "value", "partitions")),
    "/pipelines/orders/dead-letters/discard/": ({"ids": "1", "reason": "probe", "offset_from": "0"},
                                                ("ids", "reason", "offset_from")),
    "/pipelines/orders/dead-letters/replay/": ({"ids": "1", "partition": "1"}, ("ids", "partition")),
    "/alerts/ALERT/mute/": ({"minutes": "10", "reason": "deploy"}, ("minutes", "reason")),
    "/topic-checks/request/": ({"pipeline": "orders"}, ("pipeline",)),
    "/watches/new/": ({"name": "fresh-watch", "group": "fresh-group", "topic": "orders-topic", "sink_table": "",
                       "record_id": "", "row_id": "", "start_from": "earliest", "settle_seconds": "30", "ignore": ""},
                      ("name", "group", "topic", "sink_table", "record_id", "row_id", "start_from", "settle_seconds",
                       "ignore")),
    "/alerts/rules/new/": ({"name": "fresh rule", "kind": "lost", "threshold": "1", "interval_seconds": "60",
                            "statuses": "", "recipients": "ops@example.com", "reminder_seconds": "3600"},
                           ("name", "kind", "threshold", "interval_seconds", "statuses", "recipients",
                            "reminder_seconds")),
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


def broken_body(base: dict, keep=frozenset()):
    breakable = [key for key in base if key not in keep]
    keys = st.sampled_from([*breakable, "extra", "\ud800", "a\x00b"])
    return st.one_of(
        st.builds(lambda key, value: {**base, key: value}, keys, bad_values),
        bad_values.filter(lambda value: not isinstance(value, dict)),     # the whole body is not an object
        deep_texts,
    )


def broken_form(base: dict, fields):
    """Forms: a field gets a NUL, an over-long value, or a lone surrogate sent as the bytes a careless client
    sends (not UTF-8). Django reads those bytes as U+FFFD: that value may be valid, so it must only never 5xx."""
    form_bad = st.one_of(st.builds(lambda a: f"{a}\x00", text), st.integers(2_001, 20_000).map(lambda n: "9" * n),
                         st.builds(lambda a: f"{a}\ud800", text))
    return st.builds(lambda key, value: {**base, key: value}, st.sampled_from(list(fields)), form_bad)


def surrogate_in(fields: dict) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for value in fields.values() for c in value)


def snapshot(pipeline, alert) -> dict:
    """Everything a write could change."""
    pipeline = Pipeline.objects.get(pk=pipeline.pk)
    alert = Alert.objects.get(pk=alert.pk)
    return {
        "offsets": sorted(PartitionOffset.objects.values_list("pipeline_id", "partition", "next_offset",
                                                              "replay_until")),
        "pipeline": (pipeline.desired_state, pipeline.epoch, pipeline.transform, pipeline.last_error),
        "pipelines": Pipeline.objects.count(), "watches": Watch.objects.count(),
        "rules": AlertRule.objects.count(), "channels": Channel.objects.count(),
        "dead_letters": sorted(DeadLetter.objects.values_list("pk", "discarded_at", "replay_attempts")),
        "alert": (alert.state, alert.acknowledged_at), "mutes": Mute.objects.count(),
        "topic_checks": TopicCheckJob.objects.count(), "tokens": AuthToken.objects.count(),
        "actions": ActionLog.objects.exclude(result=ActionResult.REFUSED).count(),
    }


@pytest.fixture
def world(db, monkeypatch):
    cache.clear()  # throttles count per user: the fuzzer must not meet them
    no_kafka(monkeypatch)
    pipeline = make_pipeline()
    rule = AlertRule.objects.create(name="loss", kind=RuleKind.LOST, pipeline=pipeline)
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, pipeline=pipeline, state=AlertState.FIRING, summary="3 lost",
                                 started_at=now, last_seen_at=now)
    from django.test import Client

    client = Client()
    client.force_login(make_operator())
    return client, pipeline, alert


def no_kafka(monkeypatch) -> None:
    """Kafka answers at once that it cannot be reached (no broker's timeout per example); a group's page shows
    an empty group."""
    from consumers.kafka.errors import KafkaUnreachable
    from consumers.operations.groups import GroupReport

    def unreachable(*args, **kwargs):
        raise KafkaUnreachable("no broker in the fuzz test")

    for name in ("partitions_for", "watermarks", "high_watermarks"):
        monkeypatch.setattr(f"consumers.kafka.admin.{name}", unreachable)
    monkeypatch.setattr("consumers.operations.groups.describe",
                        lambda group_id, **kwargs: GroupReport(group_id, "Empty"))


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
    @given(body=broken_body(API_WRITES[endpoint], VALID_ANYWAY.get(endpoint, frozenset())))
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

    @FUZZ
    @given(fields=broken_form(*FORM_WRITES[endpoint]))
    def check(fields):
        # Encoded by hand: a lone surrogate goes as the bytes a careless client sends (not valid UTF-8).
        body = urlencode(fields, encoding="utf-8", errors="surrogatepass")
        before = snapshot(pipeline, alert)  # per example: one read as U+FFFD may have acted
        response = client.post(url, body, content_type="application/x-www-form-urlencoded")
        assert response.status_code < 500, (url, response.status_code)
        if surrogate_in(fields):
            return  # read as U+FFFD: possibly a valid form, which may act
        # The alert forms answer with a redirect and a message (no JavaScript needed); the others with a 4xx.
        assert not 200 <= response.status_code < 300, (url, response.status_code)
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
        assert not AuthToken.objects.exists()

    check()


def test_the_acknowledge_form_takes_any_broken_next_without_a_5xx_or_leaving_the_site(world):
    """The acknowledge form has no input but where to go back to: broken, it is ignored. Acknowledging is the
    form's one change (the first time); nothing else changes."""
    client, pipeline, alert = world
    url = f"/alerts/{alert.pk}/acknowledge/"
    targets = st.one_of(st.builds(lambda a: f"/{a}\x00", text), st.integers(2_001, 20_000).map(lambda n: "/" * n),
                        st.builds(lambda a: f"https://evil.example/{a}\ud800", text), st.just("//evil.example/"))

    @FUZZ
    @given(target=targets)
    def check(target):
        before = snapshot(pipeline, alert)
        body = urlencode({"next": target}, encoding="utf-8", errors="surrogatepass")
        response = client.post(url, body, content_type="application/x-www-form-urlencoded")
        after = snapshot(pipeline, alert)
        assert response.status_code < 500, response.status_code
        if response.status_code >= 400:  # refused whole (a NUL anywhere in the request): nothing changed
            assert after == before
            return
        assert response.status_code == 302, response.status_code
        assert response["Location"].startswith("/") and not response["Location"].startswith("//")
        assert Alert.objects.get(pk=alert.pk).acknowledged_at is not None
        assert {k: v for k, v in after.items() if k not in ("alert", "actions")} == \
            {k: v for k, v in before.items() if k not in ("alert", "actions")}

    check()


def test_the_schemathesis_run_reaches_every_api_url_the_alerts_api_included():
    """tests/test_api_fuzz.py fuzzes what the OpenAPI schema lists: every API route must be in it."""
    import re

    from drf_spectacular.generators import SchemaGenerator

    from alerts import api_urls as alerts_urls
    from dashboard.api import urls as api_urls

    listed = set(SchemaGenerator().get_schema(request=None, public=True)["paths"])
    routes = [("/api/", p) for p in api_urls.urlpatterns] + [("/api/alerts/", p) for p in alerts_urls.urlpatterns]
    wanted = {prefix + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(p.pattern)) for prefix, p in routes}
    wanted -= {"/api/schema/", "/api/docs/"}  # the schema and its page, not operations
    assert wanted - listed == set()
    assert {"/api/alerts/{alert_id}/mute/", "/api/alerts/{alert_id}/acknowledge/"} <= listed
