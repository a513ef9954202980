"""One send to an HTTP receiver: what the receiver answers is kept storable, and a receiver that answers slowly
cannot hold a send longer than the timeout (nor past the outbox's claim, to be sent twice)."""
import gzip
import struct
import time
import zlib

import pytest

from alerts.channels import DeliveryFailed, http
from alerts.models import Notification
from alerts.outbox import CLAIM_SECONDS, claim_seconds, deliver_due
from tests.alert_clock import frozen_clock  # noqa: F401 - an autouse fixture
from tests.receivers import TricklingReceiver
from tests.test_alert_channels import add_channel, alert_settings, at, fire_loss  # noqa: F401 - autouse fixture
from tests.test_alerts_email import T0


@pytest.fixture(params=["200 OK", "503 Service Unavailable"])
def trickling(request):
    receiver = TricklingReceiver(status=request.param).start()
    yield receiver
    receiver.stop()


def test_a_2xx_answer_holding_a_nul_is_marked_delivered_and_never_sent_again(receiver):
    """PostgreSQL refused the answer in the UPDATE that marks the row delivered: the run raised, and the row was
    sent again at every run after its claim expired."""
    receiver.text = "accepted\x00"
    add_channel("hooks", "webhook", receiver.url)
    fire_loss()

    assert deliver_due(now=T0) == {"sent": 1, "failed": 0, "gave_up": 0}
    for seconds in (CLAIM_SECONDS, 600, 3600):
        assert deliver_due(now=at(seconds)) == {"sent": 0, "failed": 0, "gave_up": 0}

    row = Notification.objects.get(channel__name="hooks")
    assert row.delivered_at == T0 and row.answer == "HTTP 200: accepted\\x00"
    assert len(receiver.requests) == 1


def test_a_receiver_trickling_its_answer_is_given_up_at_the_timeout_not_when_it_is_done(trickling):
    """requests' timeout is per read: a byte every 0.3 s held the send for as long as the receiver liked. A 2xx has
    accepted the message: its late body is cut. Any other answer is a failure."""
    assert trickling.seconds > 6 and http.timeout()[1] == 0.5

    started = time.monotonic()
    if trickling.status.startswith("200"):
        answer = http.post_json(trickling.url, b"{}", [])
        assert answer.status == 200 and "[answer cut: no answer within 0.5 s (timeout)]" in answer.text
        assert trickling.body.decode().startswith(answer.text.partition(" [answer cut")[0])   # what came in time
    else:
        with pytest.raises(DeliveryFailed, match="timeout"):
            http.post_json(trickling.url, b"{}", [])
    assert time.monotonic() - started < 3


def test_a_trickled_answer_is_delivered_once_if_it_accepted_and_retried_if_not(trickling):
    add_channel("hooks", "webhook", trickling.url)
    fire_loss()

    row = Notification.objects.get(channel__name="hooks")
    if trickling.status.startswith("200"):
        assert deliver_due(now=T0) == {"sent": 1, "failed": 0, "gave_up": 0}
        row.refresh_from_db()
        assert row.delivered_at == T0 and "answer cut" in row.answer
    else:
        assert deliver_due(now=T0) == {"sent": 0, "failed": 1, "gave_up": 0}
        row.refresh_from_db()
        assert "timeout" in row.last_error and row.delivered_at is None and row.next_attempt_at == at(5)


def test_a_claim_outlasts_the_longest_send_and_its_pace_even_with_a_long_timeout(settings):
    settings.ALERT_CHANNEL_TIMEOUT_SECONDS = 10   # the default
    assert claim_seconds() == CLAIM_SECONDS > 3 * (http.longest_send_seconds() + 1)
    settings.ALERT_CHANNEL_TIMEOUT_SECONDS = 90
    assert claim_seconds() > 3 * http.longest_send_seconds() > CLAIM_SECONDS


class GzipHeaderTrickler(TricklingReceiver):
    """200 with Content-Encoding: gzip whatever was asked, then a gzip header whose file name never ends, a byte at a
    time: urllib3 decoding it read on inside one call, never back to the deadline."""

    def _serve(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return
        with connection:
            request = b""
            while b"\r\n\r\n" not in request and (chunk := connection.recv(65536)):
                request += chunk
            self.request = request
            head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Encoding: gzip\r\n"
                    b"Content-Length: 100000\r\n\r\n")
            try:
                connection.sendall(head + b"\x1f\x8b\x08\x08" + struct.pack("<I", 0) + b"\x00\xff")
                for byte in self.body:
                    if self.stopped.wait(self.interval):
                        return
                    connection.sendall(bytes([byte]))
            except OSError:
                return


def test_a_compressed_answer_trickled_byte_by_byte_is_cut_at_the_deadline():
    receiver = GzipHeaderTrickler(body=b"n" * 25, interval=0.3).start()
    try:
        assert http.timeout()[1] == 0.5 and receiver.seconds > 7
        started = time.monotonic()
        answer = http.post_json(receiver.url, b"{}", [])
        assert answer.status == 200 and "answer cut" in answer.text
        assert time.monotonic() - started < 3
        assert b"accept-encoding: identity" in receiver.request.lower()
    finally:
        receiver.stop()


def test_an_answer_compressed_all_the_same_is_decoded_and_one_that_is_not_what_it_says_is_kept():
    assert http._decompressed(gzip.compress(b"accepted"), "gzip") == b"accepted"
    assert http._decompressed(zlib.compress(b"accepted"), "deflate") == b"accepted"
    assert http._decompressed(b"plain", "gzip") == b"plain"
    assert http._decompressed(b"plain", "") == b"plain"
