"""Reconciliation findings: typed inside, one JSON shape where they are stored or served."""
from dataclasses import FrozenInstanceError

import pytest

from consumers.reconciliation.findings import Finding
from consumers.reconciliation.report import PartitionReport, count_findings
from consumers.reconciliation.rewinds import mark_planned
from consumers.reconciliation.verify import MAX_FINDINGS_PER_KIND, fold


def test_the_json_has_the_four_range_fields_then_only_the_fields_that_are_set_in_a_fixed_order():
    assert Finding("lost", 3, 5, 2).as_json() == {"kind": "lost", "start": 3, "end": 5, "count": 2}
    duplicated = Finding("duplicated", 7, 9, 3, offsets=(7, 8), scope="verified", planned=True)
    assert list(duplicated.as_json().items()) == [
        ("kind", "duplicated"), ("start", 7), ("end", 9), ("count", 3), ("offsets", [7, 8]), ("scope", "verified"),
        ("planned", True)]
    ahead = Finding("ahead", 10, 12, 2, reason="position ahead of log end", scope="current")
    assert list(ahead.as_json()) == ["kind", "start", "end", "count", "reason", "scope"]


@pytest.mark.parametrize("stored", [
    {"kind": "lost", "start": 0, "end": 4, "count": 4},
    {"count": 3, "end": 9, "kind": "duplicated", "offsets": [7, 8], "scope": "verified", "start": 7},  # jsonb order
    {"kind": "unrecoverable", "start": 0, "end": 5, "count": 5, "reason": "skipped by retention: offsets 0..4",
     "folded": 2, "scope": "verified", "planned": True},
])
def test_a_stored_finding_reads_back_to_the_same_json(stored):
    assert Finding.from_json(stored).as_json() == stored


def test_a_finding_is_a_value():
    finding = Finding("gap", 1, 2, 1)
    with pytest.raises(FrozenInstanceError):
        finding.count = 5
    assert finding == Finding.from_json(finding.as_json())


def test_fold_keeps_the_newest_findings_and_covers_the_oldest_with_one_exact_finding():
    many = [Finding("dead_letter", 2 * i, 2 * i + 1, 1, scope="verified") for i in range(MAX_FINDINGS_PER_KIND + 4)]
    folded = fold(many + [Finding("lost", 0, 1, 1)])
    letters = [f for f in folded if f.kind == "dead_letter"]
    assert len(letters) == MAX_FINDINGS_PER_KIND
    assert letters[0] == Finding("dead_letter", 0, 9, 5, folded=5, scope="verified")
    assert letters[1:] == many[5:] and folded[-1] == Finding("lost", 0, 1, 1)


def test_a_skipped_range_splits_a_loss_into_planned_and_unplanned_parts_and_counts_them_apart():
    report = PartitionReport(0, findings=mark_planned([Finding("lost", 10, 30, 20, scope="verified")], [(15, 40)]))
    assert report.findings == [Finding("lost", 10, 15, 5, scope="verified"),
                               Finding("lost", 15, 30, 15, scope="verified", planned=True)]
    count_findings(report)
    assert (report.lost, report.skipped, report.incident) == (5, 15, True)
