"""One JSON POST with timeouts (requests), shared by the webhook, Slack and PagerDuty kinds. Anything but a
2xx answer raises DeliveryFailed with a scrubbed reason: a refused connection, a timeout, the status and body,
and on a 429 or 503 the receiver's `Retry-After` (the outbox waits at least that long, within a cap). A 400, 413
or 422 refuses the message itself and is final: the outbox gives that message up rather than retry it. A 429 is
`throttled`: the receiver asks us to slow down, which the outbox does without counting it a failure.

requests' read timeout is per socket read: a receiver trickling its answer a byte at a time would hold a send for
as long as it likes (and past the outbox's claim, for another run to send the message again). So the body is read
against a deadline as a whole (the read timeout from the headers on), and only its first ANSWER_BYTES (a 2xx whose
body is late is delivered: its status accepted the message). The status line and headers are still read with the
per-read timeout only: requests gives no way in before they have come (docs/alerts.md)."""
import time
import zlib
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import requests
import urllib3
from django.conf import settings

from alerts.channels.base import ANSWER_CHARS, Answer, DeliveryFailed, redact, short
from consumers.pg_text import storable

USER_AGENT = "Tally-Alerts/1"
# The answers whose Retry-After says when to come back (RFC 9110: 503; RFC 6585: 429).
RETRY_AFTER_STATUSES = (429, 503)
# The answers that refuse the body itself (malformed, too large, invalid: Slack's invalid_payload, PagerDuty's
# "invalid event"): the same body gets the same answer however often it is sent, and retried it would hold every
# later message of its channel. Other 4xx (401, 403, 404, 410) are about the channel's URL or key, which an
# operator fixes: those are retried, and the messages go out once they are.
REFUSED_STATUSES = (400, 413, 422)
# "Too many requests": Slack (about one message a second per webhook), PagerDuty's Events API and any webhook
# receiver that rate-limits. The receiver is up and answering; a burst of alerts waits its turn. A 503 is not
# here, Retry-After or not: it says the receiver is unavailable (down, in maintenance, a proxy with no backend),
# and a channel whose messages do not get through is failing, which is what the admins must hear.
THROTTLED_STATUSES = (429,)
# Of the answer only ANSWER_CHARS characters are kept: a few KB hold them in any encoding (and a secret it quotes,
# scrubbed before the cut), and a receiver sending megabytes does not hold the send while they come.
ANSWER_BYTES = 16 * ANSWER_CHARS
READ_CHUNK = 1024


def timeout() -> tuple[float, float]:
    """(connect, read) seconds: a receiver that hangs cannot hold the outbox longer than this."""
    seconds = float(getattr(settings, "ALERT_CHANNEL_TIMEOUT_SECONDS", 10))
    return (min(seconds, 5.0), seconds)


def longest_send_seconds() -> float:
    """The longest one send takes: connecting, then the answer's headers within the read timeout, then its body
    until the deadline (the read timeout from the headers on), where a read begun just before it may wait a read
    timeout more. The outbox's claim must outlast it (alerts/outbox.py, claim_seconds)."""
    connect, read = timeout()
    return connect + 3 * read


def post_json(url: str, body: bytes, secrets: list[str], session: requests.Session | None = None,
              headers: dict | None = None) -> Answer:
    sender = session or requests
    too_slow = f"no answer within {timeout()[1]:g} s (timeout)"
    try:
        # identity: a compressed answer is decoded by urllib3 inside one read, which a receiver can stretch a
        # byte at a time past the deadline (no output, no return); raw bytes come back at each socket read.
        response = sender.post(url, data=body, timeout=timeout(), allow_redirects=False, stream=True,
                               headers={"Content-Type": "application/json", "User-Agent": USER_AGENT,
                                        "Accept-Encoding": "identity", **(headers or {})})
    except requests.Timeout:
        raise DeliveryFailed(too_slow) from None
    except requests.ConnectionError as error:
        raise DeliveryFailed("connection failed: " + redact(_reason(error), secrets)) from None
    except requests.RequestException as error:
        raise DeliveryFailed(f"{type(error).__name__}: " + redact(str(error), secrets)) from None
    # The body gets the read timeout as a whole, from the headers on: the connection and the headers had their own
    # (per read), and a deadline from the start would fail a receiver merely slow to connect on a busy host.
    deadline = time.monotonic() + timeout()[1]
    with response:   # closed unread: the connection is dropped, not pooled with the rest of a body in it
        text = _answer_text(response, deadline, too_slow, secrets)
    # Scrubbed before it is cut short: a secret cut at the end would no longer match, and its start would show.
    # Made storable here, so every path that keeps an answer can: PostgreSQL refuses a NUL in text.
    answer = Answer(response.status_code, short(storable(redact(text, secrets))))
    if not 200 <= response.status_code < 300:
        retry_after = (retry_after_of(response.headers.get("Retry-After"))
                       if response.status_code in RETRY_AFTER_STATUSES else None)
        raise DeliveryFailed(str(answer), retry_after=retry_after, final=response.status_code in REFUSED_STATUSES,
                             throttled=response.status_code in THROTTLED_STATUSES)
    return answer


def _answer_text(response: requests.Response, deadline: float, too_slow: str, secrets: list[str]) -> str:
    """The first ANSWER_BYTES of the body, read before `deadline`. read1 returns what one read brings, so a trickle
    is checked against the deadline after each byte it sends. A 2xx status is the receiver's acceptance: a body
    that does not come in time (or breaks off) is cut there and the message counts as delivered, not sent twice.
    Any other answer must come whole in time (DeliveryFailed otherwise)."""
    accepted = 200 <= response.status_code < 300
    data, failure = b"", ""
    try:
        while len(data) < ANSWER_BYTES:
            if time.monotonic() > deadline:
                failure = too_slow
                break
            chunk = response.raw.read1(READ_CHUNK, decode_content=False)
            if not chunk:
                break
            data += chunk
    except (urllib3.exceptions.TimeoutError, requests.Timeout):
        failure = too_slow
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as error:
        failure = "connection failed while reading the answer: " + redact(str(error), secrets)
    if failure and not accepted:
        raise DeliveryFailed(failure)
    data = _decompressed(data[:ANSWER_BYTES], response.headers.get("Content-Encoding", ""))
    try:
        text = data[:ANSWER_BYTES].decode(response.encoding or "utf-8", errors="replace")
    except LookupError:   # a charset Python does not know
        text = data[:ANSWER_BYTES].decode("utf-8", errors="replace")
    return f"{text} [answer cut: {failure}]" if failure else text


def _decompressed(data: bytes, encoding: str) -> bytes:
    """A receiver that compressed its answer all the same (gzip or deflate): its first ANSWER_BYTES, decoded from
    what was read; what cannot be decoded is kept as it came."""
    if encoding.strip().lower() not in ("gzip", "x-gzip", "deflate"):
        return data
    try:
        return zlib.decompressobj(wbits=47).decompress(data, ANSWER_BYTES)   # 47: a zlib or gzip header
    except zlib.error:
        return data


def retry_after_of(value: str | None) -> int | datetime | None:
    """A `Retry-After` header: delay-seconds (an int) or an HTTP-date (an aware datetime); None when absent or
    unreadable (the outbox then keeps its own backoff)."""
    value = (value or "").strip()
    if value.isdigit():
        return int(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _reason(error: Exception) -> str:
    """The innermost cause ("[Errno 111] Connection refused"), not requests' sentence quoting the URL."""
    inner = error
    for _ in range(10):  # a chain of causes is a few links long; never loop on a cycle
        deeper = getattr(inner, "reason", None) or inner.__context__
        if deeper is None:
            break
        if isinstance(deeper, str):
            return deeper
        inner = deeper
    text = str(inner)
    # urllib3 prefixes "<urllib3.connection.HTTPConnection object at 0x...>: "; keep what follows.
    return text.split(">: ", 1)[-1]
