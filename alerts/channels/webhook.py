"""Webhook: the payload (docs/alerts.md) as a JSON POST. With a secret, the body is signed with HMAC-SHA256
in `X-Tally-Signature-256: sha256=<hex>` (as GitHub signs its webhooks); `X-Tally-Delivery` is the payload's
id, the same on every retry, so a receiver can drop a message it already has."""
import hashlib
import hmac
import json

from alerts.channels.base import Answer, mask_url, unused_settings, url_problem, url_secrets
from alerts.channels.http import post_json
from alerts.payloads import channel_test_payload

SIGNATURE_HEADER = "X-Tally-Signature-256"


def body_of(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _post(channel, payload: dict, session) -> Answer:
    body = body_of(payload)
    headers = {"X-Tally-Event": payload["event"], "X-Tally-Delivery": payload["id"]}
    if channel.secret:
        headers[SIGNATURE_HEADER] = signature(channel.secret, body)
    return post_json(channel.url, body, secret_values(channel), session.http, headers)


def send(channel, notification, session) -> Answer:
    return _post(channel, notification.payload, session)


def test(channel, session) -> Answer:
    return _post(channel, channel_test_payload(channel), session)


def mask(channel) -> dict:
    return {"url": mask_url(channel.url), "signed": bool(channel.secret)}


def problems(channel) -> dict:
    found = {}
    if problem := url_problem(channel.url):
        found["url"] = problem
    found.update(unused_settings(channel, ("routing_key", "recipients"), "A webhook takes a URL and a secret only."))
    return found


def secret_values(channel) -> list[str]:
    return [*url_secrets(channel.url), channel.secret]
