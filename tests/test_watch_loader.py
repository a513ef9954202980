"""The audit's COPY lines: the fast path for plain ids writes exactly what the general path writes."""
from collections import namedtuple
from types import SimpleNamespace

from consumers.reconciliation import watch_loader

Record = namedtuple("Record", "offset key value timestamp")
RECORDS = [Record(0, None, b"17", 1000), Record(1, None, b"0042", 1001), Record(2, None, None, 1002),
           Record(3, None, b"x\ty", 1003), Record(4, None, b"99999999999999999999", 1004), Record(5, b"k", b"-3", 1005)]


def loaded(path: str, id_type: str = "bigint") -> tuple[str, dict]:
    watch = SimpleNamespace(record_id="value", ignore=[], keyed=False)
    loader = watch_loader.Loader(cursor=None, watch=watch, id_type=id_type, ends={0: 100})
    getattr(loader, path)(0, RECORDS, loader.counts.setdefault(0, {"records": 0, "ignored": 0, "unreadable": 0}),
                          *(() if path == "_add_ids" else (100, loader.buffer.write)))
    return loader.buffer.getvalue(), loader.counts


def test_the_fast_path_writes_the_lines_and_counts_of_the_general_path():
    for id_type in ("bigint", "text", "numeric"):
        assert loaded("_add_ids", id_type) == loaded("_add_any", id_type)
    lines, counts = loaded("_add_ids")
    assert lines.splitlines()[:2] == ["0\t0\t17\tt\tf\t1000\tf\t\\N", "0\t1\t42\tt\tf\t1001\tf\t\\N"]
    assert counts == {0: {"records": 6, "ignored": 0, "unreadable": 3}}   # None, "x\ty", beyond bigint
    assert "0\t3\tx\\ty\tt\tf\t1003\tf\t\\N" in loaded("_add_ids", "text")[0].splitlines()


def test_after_flush_runs_once_per_chunk_sent_and_never_for_an_empty_one(db, monkeypatch):
    """The settled read-back moves each chunk's matching records on before the next is COPYed
    (watch_settled.read_back): the hook runs after every chunk sent, and not when nothing was."""
    from django.db import connection
    from psycopg2 import sql

    monkeypatch.setattr(watch_loader, "COPY_CHUNK", 2)
    watch = SimpleNamespace(record_id="value", ignore=[], keyed=False)
    with connection.cursor() as wrapper:
        cur = wrapper.cursor
        watch_loader.create_temporary_tables(cur, "bigint", {})
        sent = []

        def after_flush():
            cur.execute(sql.SQL("SELECT count(*) FROM {}").format(watch_loader.RELATIONS["records"]))
            sent.append(cur.fetchone()[0])

        loader = watch_loader.Loader(cur, watch, "bigint", {0: 100}, after_flush=after_flush)
        loader.add(0, RECORDS[:3])
        loader.add(0, RECORDS[3:4])
        loader.flush()
        loader.flush()
        cur.execute(watch_loader.DROP_TEMPORARY)
    assert sent == [3, 4]
