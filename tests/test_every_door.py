"""Every URL the project routes, found from the URL conf itself (so a new one cannot be missed), sent every method
by each role through the real test client: an anonymous visitor is sent to sign in (pages, the admin) or refused
(the API); a viewer's write is a 403 written to the action log as a refusal, or a method the URL does not take;
an operator's session write without its CSRF token is a 403; and a GET writes nothing, whoever sends it.

"Nothing written" is watched at the database: no INSERT, UPDATE or DELETE reaches PostgreSQL during the request
but the session's and the refusal's own row. A URL missing from the lists below fails the first test, so whoever
adds one decides which it is."""
import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import URLResolver, get_resolver
from knox.models import AuthToken

from alerts.models import Channel
from consumers.models import ActionLog, ActionResult, Watch
from tests.admin_support import staff_operator, staff_viewer
from tests.alert_rows import open_alert
from tests.views_helpers import make_pipeline

pytestmark = [pytest.mark.kafka]  # the group and cluster pages ask Kafka

WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# Reads: GET only (any other method is a 405 or refused by role).
READS = {
    "overview", "pipeline", "trace", "dead_letters", "dead_letters_csv", "clusters", "groups", "group", "watches",
    "watch", "watch_trace", "watch_findings_csv", "action_log", "topic_check_jobs", "demo", "metrics",
    "alerts:list", "alerts:rules", "alerts:channels",
    "alerts_api:list", "alerts_api:detail",
    "api:root", "api:me", "api:schema", "api:docs", "api:pipeline", "api:trace", "api:dead_letters", "api:clusters",
    "api:groups", "api:group", "api:watch_trace", "api:watch_findings_csv", "api:action_log",
}
# Writes for operators (some also show a form or a list on GET).
WRITES = {
    "new_pipeline", "pipeline_action", "rewind", "replay_dead_letters", "discard_dead_letters", "group_reset",
    "new_watch", "topic_check", "demo_run",
    "alerts:rule_new", "alerts:rule_edit", "alerts:rule_mute", "alerts:rule_test", "alerts:channel_new",
    "alerts:channel_edit", "alerts:channel_test", "alerts:channel_delete", "alerts:acknowledge", "alerts:mute",
    "alerts_api:channels", "alerts_api:channel", "alerts_api:channel_test", "alerts_api:acknowledge",
    "alerts_api:mute",
    "api:pipelines", "api:pipeline_preview", "api:reconciliation", "api:replay_dead_letters",
    "api:discard_dead_letters", "api:action", "api:rewind", "api:topic_checks", "api:group_reset", "api:watches",
    "api:watch", "api:watch_check",
}
# Open to anyone, by design: signing in and out, one's own password (here and in the admin), the favicon's redirect.
PUBLIC = {"login", "logout", "password_change", "password_change_done", "password_reset", "password_reset_done",
          "password_reset_confirm", "password_reset_complete", "api:token", "favicon", "admin:login", "admin:logout",
          "admin:password_change", "admin:password_change_done"}
# The Django admin (its own staff and permission checks): every URL under admin/.
ADMIN = "admin"


def routes():
    """(URL, name) of every route, the admin's included; path parameters filled in by `fill`."""
    def walk(resolver, prefix="", namespace=""):
        for entry in resolver.url_patterns:
            if isinstance(entry, URLResolver):
                yield from walk(entry, prefix + str(entry.pattern),
                                ":".join(n for n in (namespace, entry.namespace) if n))
            else:
                yield prefix + str(entry.pattern), ":".join(n for n in (namespace, entry.name or "") if n)
    return list(walk(get_resolver()))


def kind_of(route: str, name: str) -> str:
    name = name or route.rstrip("/").rsplit("/", 1)[-1].split(".")[0]   # the favicon's redirect has no name
    if name in PUBLIC:
        return "public"
    if route.startswith("admin/"):
        return ADMIN
    for kind, names in (("read", READS), ("write", WRITES)):
        if name in names:
            return kind
    return "unlisted"


@pytest.fixture
def world(db, kafka_bootstrap):
    """One of each object a URL can name, and a staff viewer and operator (the admin is part of every door)."""
    pipeline = make_pipeline(with_history=True)
    alert = open_alert(pipeline)
    Watch.objects.create(name="billing", group_id="team-billing", topic="billing")
    Channel.objects.create(name="ops", kind="webhook", url="https://hooks.example.com/tally")
    viewer, operator = staff_viewer(), staff_operator()
    token, _ = AuthToken.objects.create(user=operator)
    values = {"action": "start", "group_id": "team-billing", "rule_id": alert.rule_id, "alert_id": alert.pk,
              "user_id": operator.pk, "digest": token.digest, "id": operator.pk, "object_id": pipeline.pk,
              "content_type_id": "1", "uidb64": "MQ", "token": "set-password"}

    def fill(route: str, name: str) -> str:
        def value(match):
            key = match.group(1).split(":")[-1]
            if key == "name":
                return "billing" if "watch" in name else "ops" if "channel" in name else pipeline.name
            return str(values[key])
        if route.startswith("admin/^") or "(?P<" in route:   # the admin's app index and catch-all
            return "/admin/consumers/" if "app_label" in route else "/admin/nowhere/"
        return "/" + re.sub(r"<([^>]+)>", value, route)

    return {"fill": fill, "viewer": viewer, "operator": operator}


class Writes:
    """Every INSERT, UPDATE or DELETE sent to PostgreSQL, but the session's (signing in keeps it)."""

    def __init__(self):
        self.seen = []

    def __call__(self, execute, sql, params, many, context):
        text = sql if isinstance(sql, str) else repr(sql)
        if text.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) and "django_session" not in text:
            self.seen.append(text[:200])
        return execute(sql, params, many, context)


def send(client: Client, method: str, url: str):
    """The answer, and what it wrote (the refusals it added to the action log apart)."""
    refusals = set(ActionLog.objects.filter(result=ActionResult.REFUSED).values_list("pk", flat=True))
    writes = Writes()
    with connection.execute_wrapper(writes):
        response = client.generic(method, url, data="{}", content_type="application/json")
    added = ActionLog.objects.filter(result=ActionResult.REFUSED).exclude(pk__in=refusals)
    others = [w for w in writes.seen if 'INSERT INTO "consumers_actionlog"' not in w]
    return response, added.count(), others


def signed_in(user, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_every_url_is_listed_as_a_read_a_write_or_public():
    unlisted = [(route, name) for route, name in routes() if kind_of(route, name) == "unlisted"]
    assert not unlisted, f"add these to READS, WRITES or PUBLIC: {unlisted}"
    names = {name for route, name in routes()}
    assert not (READS | WRITES) - names, "listed but no longer routed"


def test_an_anonymous_visitor_is_sent_to_sign_in_or_refused_everywhere_and_nothing_changes(world):
    client = Client()
    for route, name in routes():
        if kind_of(route, name) == "public":
            continue
        url = world["fill"](route, name)
        for method in ("GET", *WRITE_METHODS):
            response, refusals, writes = send(client, method, url)
            where = (method, url, response.status_code)
            assert not writes and not refusals, where
            if url.startswith(("/api/", "/metrics")) and name != "api:docs":   # scripts and scrapers: no page
                assert response.status_code in (401, 403, 405), where
            elif response.status_code != 405:
                assert response.status_code == 302, where
                assert response["Location"].startswith(("/accounts/login/?next=", "/admin/login/?next=")), where


def test_a_viewers_write_anywhere_is_refused_and_audited_or_not_taken_and_changes_nothing(world):
    client = signed_in(world["viewer"])
    for route, name in routes():
        kind = kind_of(route, name)
        if kind == "public":
            continue
        url = world["fill"](route, name)
        for method in WRITE_METHODS:
            response, refusals, writes = send(client, method, url)
            where = (method, url, response.status_code, writes)
            assert not writes, where
            if response.status_code == 403:
                assert refusals >= 1, ("a refusal not written to the action log", *where)
            elif kind == ADMIN:
                # A changelist posted without an action shows the list; a view without that method redirects.
                assert response.status_code in (200, 302, 404, 405), where
            else:
                assert response.status_code == 405, where


def test_an_operators_session_write_without_its_csrf_token_is_refused_everywhere(world):
    client = signed_in(world["operator"], csrf=True)
    for route, name in routes():
        url = world["fill"](route, name)
        for method in WRITE_METHODS:
            response, refusals, writes = send(client, method, url)
            where = (method, url, response.status_code, writes)
            assert response.status_code in (403, 405) and not writes, where


def test_a_get_writes_nothing_whoever_sends_it(world):
    for user in (world["viewer"], world["operator"]):
        client = signed_in(user)
        for route, name in routes():
            url = world["fill"](route, name)
            response, refusals, writes = send(client, "GET", url)
            assert response.status_code < 500 and not writes, (user.username, url, response.status_code, writes)


def test_a_viewers_refused_admin_change_is_audited_once_and_an_action_refusal_is_not_written_twice(world):
    pipeline_id = world["fill"]("<object_id>", "")[1:]
    client = signed_in(world["viewer"])
    response = client.post(f"/admin/consumers/pipeline/{pipeline_id}/change/", {"topic": "auth_user"})
    assert response.status_code == 403
    refusal = ActionLog.objects.get(result=ActionResult.REFUSED)
    assert (refusal.actor, refusal.action, refusal.params["method"]) == ("vera", "consumers_pipeline_change", "POST")
    ActionLog.objects.all().delete()
    response = client.post("/admin/consumers/pipeline/", {"action": "start", "_selected_action": [pipeline_id]})
    assert response.status_code == 403
    assert ActionLog.objects.filter(result=ActionResult.REFUSED).count() == 1   # the action's own refusal only
