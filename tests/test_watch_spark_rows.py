"""The Spark path's pieces that need no Spark: the executors' rows are the COPY lines of PostgreSQL's path,
the match statements reach Spark SQL as the same text, and the threshold picks the path."""
from types import SimpleNamespace

import pyarrow as pa
import pytest
from django.db import connection
from django.test import override_settings
from psycopg2 import sql

from consumers.reconciliation import watch_audit, watch_loader, watch_match, watch_spark
from tests.test_watch_loader import RECORDS

KEYS = [None, b"k", b"heartbeat", None, b"k", b"k"]


def loader_rows(id_type, ignore, ends, keyed) -> list[tuple]:
    """The rows PostgreSQL's path COPYs, read back from its lines."""
    watch = SimpleNamespace(record_id="value", ignore=ignore, keyed=keyed)
    loader = watch_loader.Loader(cursor=None, watch=watch, id_type=id_type, ends=ends)
    records = [r._replace(key=k) for r, k in zip(RECORDS, KEYS, strict=True)]
    loader._add_any(0, records, loader.counts.setdefault(0, {"records": 0, "ignored": 0, "unreadable": 0}), ends[0],
                    loader.buffer.write)
    rows = []
    for line in loader.buffer.getvalue().splitlines():
        p, o, rid, expected, tomb, ts, tail, key = line.split("\t")
        rid = None if rid == "\\N" else rid.replace("\\t", "\t")
        rows.append((int(p), int(o), rid, expected == "t", tomb == "t", int(ts), tail == "t",
                     None if key == "\\N" else key))
    return rows


def mapper_rows(id_type, ignore, ends, keyed) -> list[tuple]:
    """The rows the executors' mapper gives for the same records (one Arrow batch, as Spark hands it)."""
    batch = pa.RecordBatch.from_pydict({
        "key": pa.array(KEYS, pa.binary()), "value": pa.array([r.value for r in RECORDS], pa.binary()),
        "partition": pa.array([0] * len(RECORDS), pa.int32()), "offset": pa.array([r.offset for r in RECORDS]),
        "ts": pa.array([r.timestamp for r in RECORDS], pa.int64())})
    out = pa.Table.from_batches(list(watch_spark.record_mapper("value", ignore, id_type, ends, keyed)([batch])))
    return [tuple(row.values()) for row in out.to_pylist()]


@pytest.mark.parametrize("id_type", ["bigint", "text", "numeric", None])
@pytest.mark.parametrize("ignore", [[], ["key=heartbeat"]])
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
def test_the_executors_derive_the_rows_postgresql_copies(id_type, ignore, keyed):
    ends = {0: 4}   # offsets 4 and 5 are the tail
    rows = mapper_rows(id_type, ignore, ends, keyed)
    assert rows == loader_rows(id_type, ignore, ends, keyed)
    # keyed value ids carry the key (a tombstone names its row through it), as hex
    assert [row[-1] for row in rows] == [k.hex() if k is not None and keyed and id_type else None for k in KEYS]


def test_the_match_statements_reach_spark_as_the_same_text_with_spark_quoting(db):
    views = {name: sql.Identifier(f"v_{name}") for name in ("records", "written", "ranges")}
    with connection.cursor() as wrapper:
        statement = watch_match.findings_sql("team", ["c0", "c1"], True, False, views)
        text = watch_spark.spark_sql(statement, wrapper.cursor)
        assert text == statement.as_string(wrapper.cursor).replace('"', "`")
    assert "`offset`" in text and "'lost'" in text and '"' not in text


@override_settings(WATCH_SPARK_THRESHOLD=100)
def test_a_check_runs_on_spark_from_the_threshold_on_and_never_with_zero():
    plans = {0: (0, 10, 60), 1: (0, 0, 49)}   # 50 + 49 records to settle
    assert not watch_audit._on_spark(plans, None)
    assert watch_audit._on_spark({**plans, 1: (0, 0, 50)}, None)
    assert watch_audit._on_spark(plans, 99) and not watch_audit._on_spark(plans, 0)
