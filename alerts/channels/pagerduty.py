"""PagerDuty Events API v2: "trigger" when an alert fires (reminders trigger again with the same dedup_key,
which PagerDuty folds into the open incident), "acknowledge" when an operator acknowledges it in Tally and
"resolve" when it resolves. The dedup_key is one per
alert, so the incident opened by the trigger is the one the resolve closes. The URL is configurable
(a regional endpoint, a proxy, a local receiver in tests); the routing key is the secret."""
import json
import re

from alerts.channels.base import MASK, Answer, DeliveryFailed, mask_url, unused_settings, url_problem, url_secrets
from alerts.channels.http import post_json
from alerts.models import PAGERDUTY_EVENTS_URL
from alerts.payloads import channel_test_payload, headline

# PagerDuty refuses a summary over 1,024 characters.
MAX_SUMMARY = 1024
# An operator's acknowledge in Tally acknowledges the incident: nobody else is paged for it meanwhile.
ACKNOWLEDGES = True
# Events that only move the incident: its key is all PagerDuty needs.
SHORT_ACTIONS = {"resolved": "resolve", "acknowledged": "acknowledge"}


def url_of(channel) -> str:
    return channel.url or PAGERDUTY_EVENTS_URL


def event(routing_key: str, payload: dict) -> dict:
    if payload["event"] in SHORT_ACTIONS:
        return {"routing_key": routing_key, "event_action": SHORT_ACTIONS[payload["event"]],
                "dedup_key": payload["dedup_key"]}
    return {
        "routing_key": routing_key, "event_action": "trigger", "dedup_key": payload["dedup_key"],
        "payload": {"summary": headline(payload)[:MAX_SUMMARY], "source": f"tally/{payload['target']['name']}",
                    "severity": payload["severity"], "timestamp": payload["fired_at"],
                    "component": payload["target"]["name"], "group": payload["cluster"],
                    "class": payload["rule"]["kind"],
                    "custom_details": {"rule": payload["rule"], "target": payload["target"],
                                       "values": payload["values"], "event": payload["event"],
                                       "reminder": payload["reminder"], "facts": payload["facts"]}},
        "client": "Tally", "client_url": payload["links"]["alerts"],
        "links": [{"href": payload["links"]["pipeline"],
                   "text": f"{payload['target']['type'].capitalize()} {payload['target']['name']}"},
                  {"href": payload["links"]["alerts"], "text": "Alerts"}],
    }


def _post(channel, payload, session) -> Answer:
    body = json.dumps(event(channel.routing_key, payload)).encode()
    try:
        return post_json(url_of(channel), body, secret_values(channel), session.http)
    except DeliveryFailed as error:
        if error.final and about_the_routing_key(str(error)):
            # PagerDuty answers a wrong key with 400 "invalid event", as it does a bad message; but the key is
            # the channel's: retried like a revoked URL, the messages go out once an operator fixes it.
            raise DeliveryFailed(str(error), retry_after=error.retry_after) from None
        raise


def about_the_routing_key(answer: str) -> bool:
    """PagerDuty's refusal names the key: "Invalid routing key", "Length of 'routing_key' is incorrect"."""
    return bool(re.search(r"routing[ _]key", answer, re.IGNORECASE))


def send(channel, notification, session) -> Answer:
    return _post(channel, notification.payload, session)


def test(channel, session) -> Answer:
    """A test incident, resolved at once (the same dedup_key), so nobody stays paged by a test."""
    payload = channel_test_payload(channel)
    triggered = _post(channel, payload, session)
    try:
        resolved = _post(channel, {**payload, "event": "resolved"}, session)
    except DeliveryFailed as error:
        # The trigger went through: someone may be paged until the incident is resolved by hand.
        raise DeliveryFailed(f"trigger: {triggered}; resolve failed: {error}; the test incident "
                             f"{payload['dedup_key']} stays open: resolve it in PagerDuty") from None
    return Answer(resolved.status, f"trigger: {triggered}; resolve: {resolved}")


def close_incident(channel, key: str, session) -> Answer:
    """Resolve the incident `key` now: the channel is being deleted, and its outbox (with any resolve still to
    come) with it."""
    return _post(channel, {"event": "resolved", "dedup_key": key}, session)


def mask(channel) -> dict:
    return {"url": mask_url(url_of(channel)), "routing_key": MASK if channel.routing_key else ""}


def problems(channel) -> dict:
    found = {}
    if channel.url and (problem := url_problem(channel.url)):
        found["url"] = problem
    key = channel.routing_key
    if not key:
        found["routing_key"] = "A PagerDuty channel needs its integration's routing key (--routing-key)."
    elif len(key.split()) != 1 or len(key) > 200:
        found["routing_key"] = "A routing key is one word without spaces."
    found.update(unused_settings(channel, ("secret", "recipients"),
                                 "A PagerDuty channel takes a routing key and optionally a URL only."))
    return found


def secret_values(channel) -> list[str]:
    return [*url_secrets(channel.url), channel.routing_key]
