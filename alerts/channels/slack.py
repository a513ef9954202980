"""Slack: an incoming-webhook message with readable blocks (header, summary, fields, partitions, buttons to
the pages). The webhook URL is the secret (its path is the token)."""
import json
import re

from alerts.channels.base import Answer, DeliveryFailed, mask_url, unused_settings, url_problem, url_secrets
from alerts.channels.http import post_json
from alerts.payloads import channel_test_payload, headline

ICON = {"fired": ":rotating_light:", "reminder": ":bell:", "resolved": ":white_check_mark:", "test": ":wave:",
        "acknowledged": ":eyes:"}
# A channel that heard the alert fire is told, in one line, who took it.
ACKNOWLEDGES = True
# Slack takes about one message a second per webhook (a short burst over it, then 429s): a delivery run spaces its
# sends to one webhook this far apart (alerts.channels.Session.pace).
SEND_INTERVAL_SECONDS = 1.0
# Slack refuses a section field over 2,000 characters and a header over 150; partitions listed at most.
MAX_FIELD = 1900
MAX_PARTITIONS = 10
# Slack's answers about the webhook URL, not the message: its body is the error word alone. Some come as a 400,
# like a bad message (invalid_payload), but sent again once an operator fixes the URL the message goes through:
# they are retried like a revoked URL's 404, and the channel's reason says what Slack meant.
URL_ERRORS = {
    "no_service": "no webhook at this URL, removed or mistyped",
    "no_service_id": "no webhook at this URL, mistyped or cut short",
    "no_team": "no workspace for this URL, mistyped or its app uninstalled",
    "team_disabled": "the workspace of this URL is disabled",
    "invalid_token": "the token in this URL is revoked or mistyped",
    "channel_not_found": "the webhook's Slack channel no longer exists",
    "channel_is_archived": "the webhook's Slack channel is archived",
    "user_not_found": "the person this webhook messages directly is no longer in the workspace",
}
FIX = "its messages wait until the channel's URL is fixed"


def _escape(text) -> str:
    """Slack's mrkdwn control characters."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _partitions(facts: dict) -> str:
    lines = []
    partitions = facts.get("partitions") or {}
    for partition, info in list(partitions.items())[:MAX_PARTITIONS]:
        info = info if isinstance(info, dict) else {}
        count = info.get("count")
        bits = [f"{count} record{'' if count == 1 else 's'}" if count else "",
                f"offsets {info['offsets_text']}" if info.get("offsets_text") else "",
                f"status {info['status']}" if info.get("status") else "",
                f"lag {info['lag_records']}" if info.get("lag_records") is not None else ""]
        lines.append(f"• partition {_escape(partition)}: " + _escape(", ".join(b for b in bits if b)))
    if len(partitions) > MAX_PARTITIONS:
        lines.append(f"… and {len(partitions) - MAX_PARTITIONS} more partitions")
    return "\n".join(lines)[:MAX_FIELD]


def acknowledged(payload: dict) -> dict:
    """One line: the room that saw it fire knows someone has it."""
    who = payload.get("acknowledged_by") or "an operator"
    text = f"{ICON['acknowledged']} {_escape(headline(payload))}: taken by {_escape(who)}"
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text[:MAX_FIELD]}}]}


def message(payload: dict) -> dict:
    if payload["event"] == "acknowledged":
        return acknowledged(payload)
    target, rule = payload["target"], payload["rule"]
    fields = [f"*Rule*\n{_escape(rule['name'])} ({_escape(rule['kind'])})",
              f"*{target['type'].capitalize()}*\n<{payload['links']['pipeline']}|{_escape(target['name'])}>",
              f"*Cluster*\n{_escape(payload['cluster'])}",
              f"*Firing since*\n{payload['fired_at']}"]
    if payload.get("resolved_at"):
        fields.append(f"*Resolved at*\n{payload['resolved_at']}")
    for key, value in (payload.get("values") or {}).items():
        fields.append(f"*{_escape(key.replace('_', ' ').capitalize())}*\n{_escape(value)}")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "emoji": True,
                                    "text": f"{ICON.get(payload['event'], '')} {headline(payload)}"[:150]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _escape(payload["summary"])[:MAX_FIELD]}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f[:MAX_FIELD]} for f in fields[:10]]},
    ]
    if partitions := _partitions(payload.get("facts") or {}):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": partitions}})
    blocks.append({"type": "actions", "elements": [
        {"type": "button", "text": {"type": "plain_text", "text": f"Open the {target['type']}"},
         "url": payload["links"]["pipeline"]},
        {"type": "button", "text": {"type": "plain_text", "text": "Alerts"}, "url": payload["links"]["alerts"]}]})
    reminder = f" · reminder {payload['reminder']}" if payload["event"] == "reminder" else ""
    blocks.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"Tally · {payload['severity']}{reminder} · event at {payload['event_at']}"}]})
    # The top-level text is mrkdwn too (Slack's notifications show it): escaped like the blocks. The header above
    # is plain_text, shown as written.
    return {"text": _escape(headline(payload)), "blocks": blocks}


def _post(channel, payload, session) -> Answer:
    body = json.dumps(message(payload)).encode()
    try:
        return post_json(channel.url, body, secret_values(channel), session.http)
    except DeliveryFailed as error:
        if code := url_error(str(error)):
            raise DeliveryFailed(f"{error} (Slack: {URL_ERRORS[code]}; {FIX})", retry_after=error.retry_after,
                                 throttled=error.throttled) from None
        raise


def url_error(answer: str) -> str | None:
    """The URL error Slack answered ("HTTP 400: no_service_id" -> "no_service_id"), if it is one. Only the bare
    word counts: a proxy's error page that happens to quote one is not Slack's answer."""
    found = re.fullmatch(r"HTTP \d{3}: (\w+)", answer.strip())
    return found.group(1) if found and found.group(1) in URL_ERRORS else None


def send(channel, notification, session) -> Answer:
    return _post(channel, notification.payload, session)


def test(channel, session) -> Answer:
    return _post(channel, channel_test_payload(channel), session)


def mask(channel) -> dict:
    return {"url": mask_url(channel.url)}


def problems(channel) -> dict:
    found = {}
    if problem := url_problem(channel.url):
        found["url"] = problem
    found.update(unused_settings(channel, ("routing_key", "secret", "recipients"),
                                 "A Slack channel takes its incoming-webhook URL only."))
    return found


def secret_values(channel) -> list[str]:
    return url_secrets(channel.url)
