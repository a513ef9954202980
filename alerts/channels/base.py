"""What every channel kind shares: the receiver's answer, the failure it raises, and the masking of secrets.

A kind is a module with the same five names (see alerts/channels/__init__.py):
  send(channel, notification, session) -> Answer   deliver one outbox row; raise DeliveryFailed otherwise
  test(channel, session) -> Answer                 a test message, answered by the receiver
  mask(channel) -> dict                            the channel's settings as anyone may see them
  problems(channel) -> dict                        what is wrong with its settings ({} when valid)
  secret_values(channel) -> list[str]              the secrets it holds, scrubbed from every error text
"""
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote_plus, urlsplit

MASK = "••••••••"
# A receiver's answer is kept short: enough to see "invalid_token" or "rate limited", not a whole HTML page.
ANSWER_CHARS = 300


@dataclass
class Answer:
    """What the receiver said: an HTTP status (None for SMTP) and its first words."""

    status: int | None
    text: str

    def __str__(self):
        return f"HTTP {self.status}: {self.text}" if self.status is not None else self.text


class DeliveryFailed(Exception):
    """The receiver was unreachable, too slow, or answered other than 2xx. The message is already scrubbed of
    the channel's secrets. `retry_after` is the wait the receiver asked for (its `Retry-After` on a 429 or
    503): seconds, or the moment it named; None when it asked for nothing. `final`: the receiver refused this
    message itself (alerts/channels/http.py, REFUSED_STATUSES), so sending it again cannot help. `throttled`: the
    receiver is up and asked us to slow down (a 429): the message waits, and the channel is not failing for it."""

    def __init__(self, message: str, retry_after: "int | datetime | None" = None, final: bool = False,
                 throttled: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.final = final
        self.throttled = throttled


def unused_settings(channel, fields: tuple[str, ...], message: str) -> dict:
    """`message` for each of `fields` the channel sets, though its kind takes none of them."""
    return {field: message for field in fields if getattr(channel, field)}


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret replaced by the mask (longest first, so a secret inside another goes too)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def mask_url(url: str) -> str:
    """Scheme and host only: tokens live in paths (Slack), query strings and user info."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    rest = MASK if (parts.path.strip("/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{host}{port}/{rest}"


def url_secrets(url: str) -> list[str]:
    """The parts of a URL that may hold a token: path, query, user info (and the whole URL)."""
    if not url:
        return []
    parts = urlsplit(url)
    pieces = [url, parts.path.strip("/"), parts.query, parts.username or "", parts.password or ""]
    # Each path segment and query value too (as written and decoded): an error may quote only part of the path,
    # or a token alone.
    values = [pair.partition("=")[2] for pair in parts.query.split("&")]
    pieces += [piece for piece in [*parts.path.split("/"), *values, *map(unquote_plus, values)] if len(piece) >= 6]
    return [p for p in pieces if p]


def url_problem(url: str) -> str | None:
    if not url:
        return "A URL is required for this kind."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return "Not a valid URL."
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "Give an http:// or https:// URL with a host."
    return None


def short(text: str) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= ANSWER_CHARS else text[:ANSWER_CHARS - 1] + "…"
