"""The parking watcher's rules (consumers/engine/parking.py), with a stand-in for Kafka: which parked runs it wakes.
The parked runs themselves, against the real broker, are tests/test_parking.py."""
from kafka import TopicPartition

from consumers.engine import parking


class FakeConsumer:
    def __init__(self, ends, partitions, fail=False):
        self.ends, self.partitions, self.fail = ends, partitions, fail

    def topics(self):
        return set(self.partitions)

    def partitions_for_topic(self, topic):
        return self.partitions[topic]

    def end_offsets(self, tps):
        if self.fail:
            raise TimeoutError("no broker answered")
        return {tp: self.ends[tp] for tp in tps}


def test_the_watcher_wakes_only_the_runs_with_records_past_their_positions_or_a_grown_topic():
    lot = parking.Lot()
    quiet = parking.Parked("c", "quiet", "read_committed", {0: 5, 1: 7}, {0, 1})
    busy = parking.Parked("c", "busy", "read_committed", {0: 3}, {0})
    grown = parking.Parked("c", "grown", "read_committed", {0: 2}, {0})
    lot.parked = {quiet, busy, grown}
    lot._consumers[("c", "read_committed")] = FakeConsumer(
        {TopicPartition("quiet", 0): 5, TopicPartition("quiet", 1): 7, TopicPartition("busy", 0): 4,
         TopicPartition("grown", 0): 2},
        {"quiet": [0, 1], "busy": [0], "grown": [0, 1]})
    lot.check_once(now=0.0)
    assert (quiet.woken.is_set(), busy.reason, grown.reason) == (False, "records", "the topic has new partitions")


def test_when_the_log_ends_cannot_be_read_every_run_of_that_cluster_wakes_to_see_for_itself():
    lot = parking.Lot()
    runs = [parking.Parked("c", f"t{i}", "read_committed", {0: 1}, {0}) for i in range(2)]
    other = parking.Parked("d", "t", "read_committed", {0: 1}, {0})
    lot.parked = {*runs, other}
    lot._consumers[("c", "read_committed")] = FakeConsumer({}, {}, fail=True)
    lot._consumers[("d", "read_committed")] = FakeConsumer({TopicPartition("t", 0): 1}, {"t": [0]})
    lot.check_once(now=0.0)
    assert all(run.reason.startswith("log ends unreadable") for run in runs)
    assert not other.woken.is_set()
    assert ("c", "read_committed") not in lot._consumers   # rebuilt at the next check
