"""Reading a range of positions whose start is no longer in the log (retention removed it since the caller read the
log start) fails the read, instead of handing the range over as read with no record: kafka-python's default reset
jumps to the log end. The embedded broker deletes nothing, so a stand-in consumer answers as kafka-python does."""
import pytest
from kafka.errors import OffsetOutOfRangeError

from consumers.kafka import ranges
from consumers.kafka.admin import KafkaAdminError
from tests.watch_helpers import produce


class RetainedConsumer:
    """kafka-python's consumer over a log whose start retention moved to `log_start`: a fetch below it is out of
    range, which the consumer's auto_offset_reset decides (latest: jump to the end; none: raise)."""

    def __init__(self, log_start: int, high: int, **config):
        self.log_start, self.high, self.reset = log_start, high, config.get("auto_offset_reset", "latest")
        self.positions = {}

    def assign(self, tps):
        self.positions = {tp: None for tp in tps}

    def seek(self, tp, offset):
        self.positions[tp] = offset

    def poll(self, timeout_ms, max_records):
        for tp, position in self.positions.items():
            if position < self.log_start:
                if self.reset == "none":
                    raise OffsetOutOfRangeError({tp: position})
                self.positions[tp] = self.high if self.reset == "latest" else self.log_start
        return {}

    def position(self, tp):
        return self.positions[tp]

    def highwater(self, tp):
        return self.high

    def pause(self, tp):
        pass

    def close(self):
        pass


def test_a_range_whose_start_retention_removed_fails_instead_of_reading_as_empty(monkeypatch):
    monkeypatch.setattr(ranges, "probe_consumer", lambda cluster, **config: RetainedConsumer(6, 10, **config))
    handed = []

    with pytest.raises(KafkaAdminError, match=r"offsets \{0: 2\} are outside the log"):
        ranges.read_ranges("orders", {0: (2, 8)}, lambda p, records: handed.extend(records))

    assert handed == []


@pytest.mark.kafka
def test_a_range_inside_the_log_is_read_whole_from_the_broker(make_topic):
    topic = make_topic("kept")
    produce(topic, [(None, str(v).encode()) for v in range(10)])
    handed = []

    assert ranges.read_ranges(topic, {0: (3, 8)}, lambda p, records: handed.extend(records)) == {0: 8}

    assert [(r.offset, r.value) for r in handed] == [(o, str(o).encode()) for o in range(3, 8)]
