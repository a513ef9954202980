"""A slice's fetch comes from the driver's offset log (positions), not from its records' offsets."""
from consumers.engine.spark_commit import SliceJob, slice_fetch
from consumers.engine.transforms import SourceRecord


def _job(fetches):
    return SliceJob(dsn={}, pipeline_id=1, topic="t", sink_table="s", transform="int_value", exactly_once=True,
                    stop_on_bad_record=False, epoch=1, fetches=fetches)


def _records(*offsets):
    return [SourceRecord(0, offset, None, b"1", 0) for offset in offsets]


def test_a_slice_ending_on_a_transaction_marker_stores_the_position_past_it():
    fetch = slice_fetch(_job({0: (6, 12)}), 0, _records(6, 7, 8, 9, 10))
    assert (fetch.start, fetch.end) == (6, 12)


def test_a_partition_added_during_the_run_starts_at_its_first_record():
    fetch = slice_fetch(_job({0: (None, 5)}), 0, _records(2, 3))
    assert (fetch.start, fetch.end) == (2, 5)


def test_without_an_offset_log_entry_the_records_bound_the_fetch():
    fetch = slice_fetch(_job({}), 0, _records(4, 5, 6))
    assert (fetch.start, fetch.end) == (4, 7)
