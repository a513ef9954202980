"""One JSON POST with timeouts (requests), shared by the webhook, Slack and PagerDuty kinds. Anything but a
2xx answer raises DeliveryFailed with a scrubbed reason: a refused connection, a timeout, the status and body,
and on a 429 or 503 the receiver's `Retry-After` (the outbox waits at least that long, within a cap). A 400, 413
or 422 refuses the message itself and is final: the outbox gives that message up rather than retry it. A 429 is
`throttled`: the receiver asks us to slow down, which the outbox does without counting it a failure."""
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import requests
from django.conf import settings

from alerts.channels.base import Answer, DeliveryFailed, redact, short

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


def timeout() -> tuple[float, float]:
    """(connect, read) seconds: a receiver that hangs cannot hold the outbox longer than this."""
    seconds = float(getattr(settings, "ALERT_CHANNEL_TIMEOUT_SECONDS", 10))
    return (min(seconds, 5.0), seconds)


def post_json(url: str, body: bytes, secrets: list[str], session: requests.Session | None = None,
              headers: dict | None = None) -> Answer:
    sender = session or requests
    try:
        response = sender.post(url, data=body, timeout=timeout(), allow_redirects=False,
                               headers={"Content-Type": "application/json", "User-Agent": USER_AGENT,
                                        **(headers or {})})
    except requests.Timeout:
        raise DeliveryFailed(f"no answer within {timeout()[1]:g} s (timeout)") from None
    except requests.ConnectionError as error:
        raise DeliveryFailed("connection failed: " + redact(_reason(error), secrets)) from None
    except requests.RequestException as error:
        raise DeliveryFailed(f"{type(error).__name__}: " + redact(str(error), secrets)) from None
    # Scrubbed before it is cut short: a secret cut at the end would no longer match, and its start would show.
    answer = Answer(response.status_code, short(redact(response.text, secrets)))
    if not 200 <= response.status_code < 300:
        retry_after = (retry_after_of(response.headers.get("Retry-After"))
                       if response.status_code in RETRY_AFTER_STATUSES else None)
        raise DeliveryFailed(str(answer), retry_after=retry_after, final=response.status_code in REFUSED_STATUSES,
                             throttled=response.status_code in THROTTLED_STATUSES)
    return answer


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
