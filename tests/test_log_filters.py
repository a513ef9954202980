"""kafka-python's "Metadata refresh: failed" at a client's close (a cancelled request) is not shown as an ERROR;
the same line with any other failure still is. Logged through the logging configuration Tally's settings load."""
import logging

import pytest
from kafka.errors import Cancelled, KafkaConnectionError, KafkaTimeoutError


class Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def kafka_log():
    collect, parent = Collect(), logging.getLogger("kafka")
    parent.addHandler(collect)
    yield collect.messages
    parent.removeHandler(collect)


def test_a_cancelled_metadata_refresh_at_close_is_dropped_and_real_failures_are_kept(kafka_log):
    cluster_log = logging.getLogger("kafka.cluster")   # the logger kafka-python's ClusterMetadata writes to
    cluster_log.error("Metadata refresh: failed %s", Cancelled())
    cluster_log.error("Metadata refresh: failed %s", KafkaConnectionError("connection reset"))
    cluster_log.error("Metadata refresh: failed %s", KafkaTimeoutError())
    cluster_log.error("Metadata refresh loop error: %s", Cancelled())   # another message: kept
    assert kafka_log == ["Metadata refresh: failed KafkaConnectionError: connection reset",
                         "Metadata refresh: failed KafkaTimeoutError", "Metadata refresh loop error: Cancelled"]
