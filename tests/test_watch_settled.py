"""Keyed watches read back what earlier checks settled from the first record as new as the oldest one judged, and
at most SETTLED_READ_LIMIT positions of a partition: a cut says where in the check's notes."""
from types import SimpleNamespace

from consumers.reconciliation import watch_settled


def read_back(monkeypatch, newer_from: dict, settled: dict, limit: int = 100) -> tuple[dict, list]:
    monkeypatch.setattr(watch_settled, "SETTLED_READ_LIMIT", limit)
    monkeypatch.setattr(watch_settled.kafka_admin, "offsets_for_time",
                        lambda topic, partitions, ts, cluster=None: {p: newer_from.get(p) for p in partitions})
    notes: list[str] = []
    return watch_settled.windows(SimpleNamespace(topic="t", cluster="default"), settled, 1_700_000_000_000,
                                 notes), notes


def test_each_partition_is_read_back_from_its_first_record_as_new_as_the_oldest_judged(monkeypatch):
    spans, notes = read_back(monkeypatch, {0: 40, 1: 7, 2: None, 3: 90}, {0: (0, 50), 1: (10, 20), 2: (0, 5),
                                                                          3: (0, 90)})

    assert spans == {0: (40, 50), 1: (10, 20)} and notes == []   # 2: nothing that new; 3: only past its mark


def test_a_partition_far_ahead_is_read_back_to_the_limit_and_the_cut_is_noted(monkeypatch):
    spans, notes = read_back(monkeypatch, {0: 0, 1: 995}, {0: (0, 1000), 1: (0, 1000)})

    assert spans == {0: (900, 1000), 1: (995, 1000)}
    assert len(notes) == 1 and "offset 900 of partition 0 (not 0)" in notes[0]


def test_a_check_that_judges_no_record_reads_nothing_back(monkeypatch):
    monkeypatch.setattr(watch_settled.kafka_admin, "offsets_for_time", None)   # not asked

    assert watch_settled.windows(SimpleNamespace(topic="t", cluster="default"), {0: (0, 9)}, None, []) == {}
