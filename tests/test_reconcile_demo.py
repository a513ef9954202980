"""The chaos numbers: the classic demo runs the three delivery modes with SIGKILL crashes, and
reconciliation's lost and duplicated counts must equal a row-by-row count of each sink (by value, which
does not rely on provenance) — and be zero for exactly-once."""
import pytest

from consumers.demo.classic import run_classic_demo
from consumers.models import Pipeline
from consumers.reconciliation import reconcile
from tests.waiting import patience

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]

RECORDS = 80


def test_reconciliation_counts_exactly_what_the_crashed_classic_consumers_lost_and_duplicated(demo):
    result = run_classic_demo(records=RECORDS, crash_probability=0.35, max_restarts=6, partitions=2,
                              timeout_s=patience(300))
    assert all(outcome["state"] == "done" for outcome in result.values()), result
    reports = {r.name: r for r in reconcile.reconcile_all()}
    for name, outcome in result.items():
        report = reports[name]
        row_by_row_duplicated = sum(count - 1 for count in outcome["duplicated"].values())
        assert (report.lost, report.duplicated) == (len(outcome["missing"]), row_by_row_duplicated), (name, outcome)
        assert report.phantom == 0 and report.lag_records == 0 and report.kafka_error == ""
    assert reports["nums-exactly-once"].exact and reports["nums-exactly-once"].status == "OK"
    # The crashes did happen, and were of the kind each mode suffers from.
    assert result["nums-at-most-once"]["restarts"] > 0 and result["nums-at-least-once"]["restarts"] > 0
    lossy, doubled = reports["nums-at-most-once"], reports["nums-at-least-once"]
    assert lossy.duplicated == 0 and lossy.lost == lossy.gap
    assert doubled.lost == 0 and doubled.duplicated == doubled.overlap
    # A second run reads nothing new and keeps the same numbers.
    again = {r.name: r for r in reconcile.reconcile_all()}
    for name, report in again.items():
        assert (report.lost, report.duplicated) == (reports[name].lost, reports[name].duplicated)
        assert all(p.checked_from == p.verified_offset for p in report.partitions)
    assert Pipeline.objects.get(name="nums-at-most-once").health.lost == lossy.lost
