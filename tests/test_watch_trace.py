"""Each finding of a watch traced (offset -> value -> expected row id -> rows found) and all findings exported
as CSV, through the real API and pages, after a real run: a plain consumer SIGKILLed after its commit."""
import csv
import io
import uuid

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine import sink_checks
from consumers.kafka import admin
from consumers.models import WatchFinding
from consumers.operations import watch_setup
from consumers.reconciliation import watch_audit, watch_pass, watch_trace
from tests.db_roles import acting_as, new_role
from tests.views_helpers import client_of, make_operator, make_viewer
from tests.watch_helpers import as_offsets, id_counts, produce, read_topic, run_plain_consumer

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def execute(statement: sql.Composable, params=()) -> None:
    with connection.cursor() as cur:
        cur.execute(statement.as_string(cur.cursor), params)


def value_watch(make_topic, table: str, name: str, id_type: str, values: list[bytes], rows: str):
    """A topic of `values`, the team's table `table (id id_type)` holding `rows` (SQL VALUES), the group (named
    after the watch) committed at the end, and a watch of them by value, settling at once."""
    topic, group = make_topic(name), f"{name}-{uuid.uuid4().hex[:6]}"
    produce(topic, [(None, value) for value in values])
    execute(sql.SQL("CREATE TABLE {} (id {})").format(sql.Identifier(table), sql.SQL(id_type)))
    execute(sql.SQL("INSERT INTO {} VALUES {}").format(sql.Identifier(table), sql.SQL(rows)))
    admin.commit_offsets(group, topic, {0: len(values)})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=name, group=group, topic=topic, sink_table=table,
                                                        record_id="value", row_id="id", settle_seconds=0))
    return watch


def csv_rows(response) -> list[dict]:
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


@pytest.mark.chaos
def test_each_finding_traces_to_its_value_id_and_rows_on_the_api_and_the_page(make_topic, subprocess_env,
                                                                             table_name):
    topic = make_topic("nums", partitions=2)
    produce(topic, [(None, str(v).encode()) for v in range(1, 61)], partitions=2)
    group = f"g-{uuid.uuid4().hex[:6]}"
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write", die_at_batch=2) == -9
    assert run_plain_consumer(subprocess_env, topic, group, table_name, "commit-then-write") == 0
    records = read_topic(topic)
    written = id_counts(table_name)
    lost = {at for at, (_, value, _) in records.items() if int(value) not in written}
    delivered = sorted(at for at in records if at not in lost)
    doubled = delivered[0]   # the team's table also holds one row twice
    execute(sql.SQL("INSERT INTO {} (id) VALUES (%s)").format(sql.Identifier(table_name)),
            [int(records[doubled][1])])
    operator, viewer = client_of(make_operator()), client_of(make_viewer())
    created = operator.post("/api/watches/", {"name": "traced", "group": group, "topic": topic,
                                              "sink_table": table_name, "record_id": "value", "row_id": "id",
                                              "settle_seconds": 0}, content_type="application/json")
    assert created.status_code == 201, created.content
    checked = operator.post("/api/watches/traced/check", {}, content_type="application/json").json()
    assert lost and as_offsets(checked["lost_offsets"]) == lost
    assert as_offsets(checked["duplicated_offsets"]) == {doubled}

    for partition, offset in sorted(lost):
        value = records[(partition, offset)][1].decode()
        t = viewer.get(f"/api/watches/traced/trace?partition={partition}&offset={offset}").json()
        assert (t["verdict"], t["record"]["value"], t["expected_id"], t["rows_found"], t["rows"]) == \
            ("lost", value, [value], 0, []), t
        assert t["finding"]["kind"] == "lost" and t["row_columns"] == ["id"]
    t = viewer.get(f"/api/watches/traced/trace?partition={doubled[0]}&offset={doubled[1]}").json()
    value = records[doubled][1].decode()
    assert (t["verdict"], t["expected_id"], t["rows_found"], t["finding"]["extra"]) == ("duplicated", [value], 2, 1)
    assert [row["id"] for row in t["rows"]] == [int(value), int(value)]
    fine = delivered[-1]
    t = viewer.get(f"/api/watches/traced/trace?partition={fine[0]}&offset={fine[1]}").json()
    assert (t["verdict"], t["finding"], t["rows_found"]) == ("delivered", None, 1)
    beyond = max(o for p, o in records if p == 0) + 5
    t = viewer.get(f"/api/watches/traced/trace?partition=0&offset={beyond}").json()
    assert t["verdict"] == "not audited" and t["record"] is None
    bad = viewer.get("/api/watches/traced/trace?partition=x&offset=1")
    assert bad.status_code == 400 and bad.json()["field"] == "partition"
    assert viewer.get("/api/watches/traced/trace?partition=7&offset=1").json()["field"] == "partition"
    huge = viewer.get(f"/api/watches/traced/trace?partition=0&offset={2**63}")
    assert huge.status_code == 400 and huge.json()["field"] == "offset"

    page = viewer.get("/watches/traced/").content.decode()
    partition, offset = sorted(lost)[0]
    assert f'href="/watches/traced/trace/?partition={partition}&amp;offset={offset}"' in page
    assert 'href="/watches/traced/findings.csv"' in page
    traced = viewer.get(f"/watches/traced/trace/?partition={partition}&offset={offset}").content.decode()
    value = records[(partition, offset)][1].decode()
    assert 'data-verdict="lost"' in traced and f"<code>id</code> = <code>{value}</code>" in traced
    assert '<b data-field="rows_found">0</b>' in traced and f'<pre class="record">{value}</pre>' in traced
    refused = viewer.get("/watches/traced/trace/?partition=0&offset=-1")
    assert refused.status_code == 422 and 'id="trace-error"' in refused.content.decode()

    expected = [{"partition": str(p), "offset": str(o), "kind": "lost", "extra_rows": "0"} for p, o in lost]
    expected.append({"partition": str(doubled[0]), "offset": str(doubled[1]), "kind": "duplicated", "extra_rows": "1"})
    for response in (viewer.get("/watches/traced/findings.csv"), viewer.get("/api/watches/traced/findings.csv")):
        rows = csv_rows(response)
        assert [{k: r[k] for k in ("partition", "offset", "kind", "extra_rows")} for r in rows] == \
            sorted(expected, key=lambda r: (int(r["partition"]), int(r["offset"])))
        assert all(r["checked_at"] for r in rows)


def test_the_csv_export_holds_every_finding_beyond_the_thousand_listed(make_topic, table_name):
    topic = make_topic("many")
    produce(topic, [(None, str(v).encode()) for v in range(1, 2501)])
    execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} SELECT g FROM generate_series(1, 2500) g WHERE g %% 25 = 0").format(
        sql.Identifier(table_name)))   # 100 delivered, 2,400 lost
    admin.commit_offsets("many-group", topic, {0: 2500})
    operator = client_of(make_operator())
    assert operator.post("/api/watches/", {"name": "many", "group": "many-group", "topic": topic,
                                           "sink_table": table_name, "record_id": "value", "row_id": "id",
                                           "settle_seconds": 0}, content_type="application/json").status_code == 201
    checked = operator.post("/api/watches/many/check", {}, content_type="application/json").json()
    assert checked["lost"] == 2400 and len(checked["lost_offsets"]) == 1000
    rows = csv_rows(operator.get("/api/watches/many/findings.csv"))
    assert [int(r["offset"]) for r in rows] == [o for o in range(2500) if (o + 1) % 25 != 0]
    assert {r["kind"] for r in rows} == {"lost"}
    # Kept as runs: the 24 lost between two delivered records are one row.
    assert sorted(WatchFinding.objects.values_list("offset", "run_length")) == [(25 * i, 24) for i in range(100)]
    inside, delivered = (operator.get(f"/api/watches/many/trace?partition=0&offset={o}").json() for o in (30, 49))
    assert (inside["verdict"], inside["finding"]["kind"]) == ("lost", "lost")
    assert (delivered["verdict"], delivered["finding"]) == ("delivered", None)
    page = operator.get("/watches/many/").content.decode()
    assert "Lost (1000, the first 1,000)" in page


def test_a_record_an_ignore_spec_names_traces_as_ignored_with_offset_ids_too(make_topic, table_name):
    """With `offset` ids the audit expects no row for an ignored record: the trace says so, not "delivered"."""
    topic, group = make_topic("skips"), f"skips-{uuid.uuid4().hex[:6]}"
    produce(topic, [(None, b'{"type": "order"}'), (None, b'{"type": "heartbeat"}'), (None, b'{"type": "order"}')])
    execute(sql.SQL("CREATE TABLE {} (p integer, o bigint)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} VALUES (0, 0), (0, 2)").format(sql.Identifier(table_name)))
    admin.commit_offsets(group, topic, {0: 3})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="skips", group=group, topic=topic, sink_table=table_name,
                                                        record_id="offset", row_id="p,o", settle_seconds=0,
                                                        ignore=["json:type=heartbeat"]))
    assert watch_audit.check_watch(watch).clean
    skipped = watch_trace.trace(watch, 0, 1)
    assert (skipped.verdict, skipped.expected_id, skipped.rows_found) == ("ignored", [0, 1], 0)
    assert "json:type=heartbeat" in skipped.explanation
    assert watch_trace.trace(watch, 0, 2).verdict == "delivered"


@pytest.mark.parametrize("tombstone_after_ms", [2000, -1000], ids=["in-time", "stamped-before-its-record"])
def test_a_keyed_tombstone_the_audit_named_through_its_key_traces_as_the_delete_it_is(make_topic, table_name,
                                                                                      tombstone_after_ms):
    """`json:PATH` ids, keyed: a's tombstone deletes row A (its key's latest readable record's id) and row A is
    gone, so the audit found it clean: the trace names that id and says the delete reached the table, also when
    a skewed producer clock stamped it before its record. d's tombstone, of a key never written, names no row:
    unreadable."""
    from tests.test_watch_keyed_edges import T0, produce_at

    topic, group = make_topic("orders"), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", b'{"id": "A"}', T0), (0, b"b", b'{"id": "B"}', T0 + 1000),
                       (0, b"a", None, T0 + tombstone_after_ms), (0, b"d", None, T0 + 3000)])
    execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} VALUES ('B')").format(sql.Identifier(table_name)))
    admin.commit_offsets(group, topic, {0: 4})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="deletes", group=group, topic=topic,
                                                        sink_table=table_name, record_id="json:id", row_id="id",
                                                        keyed=True, settle_seconds=0))
    assert watch_audit.check_watch(watch).clean

    deleted = watch_trace.trace(watch, 0, 2)
    assert (deleted.verdict, deleted.expected_id, deleted.rows_found) == ("delivered", ["A"], 0)
    assert "tombstone" in deleted.explanation and "partition 0, offset 0" in deleted.explanation
    unnamed = watch_trace.trace(watch, 0, 3)
    assert (unnamed.verdict, unnamed.expected_id) == ("unreadable", None)
    assert "tombstone" in unnamed.explanation


def test_a_tombstone_traces_as_the_audit_ranks_it_whatever_an_unreadable_record_of_its_key_says(make_topic,
                                                                                                  table_name):
    """Key a: A (p0, T0+1s), an unreadable value (p0, T0+5s), a's tombstone (p0, T0+2s); B (p1, T0+3s). The audit
    ranks readable records and expected tombstones only: the tombstone names A, and the check is clean. The trace
    counted the unreadable record too, ranked the tombstone after B and named B."""
    from tests.test_watch_keyed_edges import T0, produce_at

    topic, group = make_topic("orders", partitions=2), f"g-{uuid.uuid4().hex[:6]}"
    produce_at(topic, [(0, b"a", b'{"id": "A"}', T0 + 1000), (0, b"a", b'{"other": 1}', T0 + 5000),
                       (0, b"a", None, T0 + 2000), (1, b"a", b'{"id": "B"}', T0 + 3000)])
    execute(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} VALUES ('B')").format(sql.Identifier(table_name)))
    admin.commit_offsets(group, topic, {0: 3, 1: 1})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name="ranked", group=group, topic=topic,
                                                        sink_table=table_name, record_id="json:id", row_id="id",
                                                        keyed=True, settle_seconds=0))
    report = watch_audit.check_watch(watch)
    assert (report.checked, report.lost, report.clean) == (4, 0, True), report.as_json()

    deleted = watch_trace.trace(watch, 0, 2)
    assert (deleted.verdict, deleted.expected_id) == ("delivered", ["A"]), deleted.explanation


def test_an_id_its_integer_column_cannot_hold_is_unreadable_and_traces_so_on_the_api_and_the_page(make_topic,
                                                                                                    table_name):
    """An `integer` row-id column and a record whose id, 99999999999, only a bigint holds: no row can name it. The
    audit counted it lost and its trace, the link the watch page gives for a lost offset, was a 500 (PostgreSQL's
    "integer out of range" on comparing the column with it)."""
    watch = value_watch(make_topic, table_name, "narrow", "integer", [b"1", b"99999999999", b"3"], "(1), (3)")

    report = watch_audit.check_watch(watch)

    assert (report.lost, [r.unreadable for r in report.new_ranges]) == (0, [1])
    viewer = client_of(make_viewer())
    api = viewer.get("/api/watches/narrow/trace?partition=0&offset=1")
    assert api.status_code == 200
    assert (api.json()["verdict"], api.json()["expected_id"]) == ("unreadable", None)
    assert viewer.get("/watches/narrow/trace/?partition=0&offset=1").status_code == 200


def test_a_trace_of_a_table_tally_may_no_longer_read_says_the_grant_instead_of_failing(make_topic, table_name):
    """The team revoked Tally's SELECT on its table after the watch was made: the trace is refused naming the grant
    to give back (the API's 400, the page's 422), as validation refuses such a table, not answered with a 500."""
    watch = value_watch(make_topic, table_name, "revoked", "bigint", [b"1", b"2"], "(1)")
    assert watch_audit.check_watch(watch).lost == 1
    operator = client_of(make_operator())
    with new_role("tally_web") as role:   # Tally's database user, with every grant but the team's table
        execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(role))
        execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(role))
        execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table_name), role))
        with acting_as(role):
            api = operator.get("/api/watches/revoked/trace?partition=0&offset=1")
            page = operator.get("/watches/revoked/trace/?partition=0&offset=1")
    said = f"the database user may not read {table_name!r}: GRANT SELECT ON it to Tally's database user"
    assert (api.status_code, api.json()["error"]) == (400, said)
    assert page.status_code == 422 and said.replace("'", "&#x27;") in page.content.decode()


@pytest.mark.parametrize("through", ["check", "pass"])
def test_a_quiet_watch_of_a_table_tally_may_no_longer_read_is_err_with_the_grant(make_topic, table_name, through):
    """A dropped table is an ERR at every check, not only one with a range to audit; so is a table whose SELECT was
    revoked: a watch with nothing new to audit does not stay OK while Tally could not read a new range."""
    topic, group = make_topic("quiet"), f"quiet-{uuid.uuid4().hex[:6]}"
    produce(topic, [(None, b"1")])
    execute(sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(table_name)))
    execute(sql.SQL("INSERT INTO {} VALUES (1)").format(sql.Identifier(table_name)))
    admin.commit_offsets(group, topic, {0: 1})
    watch, _ = watch_setup.create(watch_setup.WatchSpec(name=f"quiet-{through}", group=group, topic=topic,
                                                        sink_table=table_name, record_id="value", row_id="id",
                                                        settle_seconds=0))
    assert watch_audit.check_watch(watch).status == "OK"
    with new_role("tally_beat") as role:
        execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(role))
        execute(sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(role))
        execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(sql.Identifier(table_name), role))
        with acting_as(role):
            if through == "pass":
                [report] = [r for r in watch_pass.check_all() if r.watch == watch.name]
            else:
                report = watch_audit.check_watch(watch)
    assert (report.status, report.error) == ("ERR", sink_checks.read_refused(table_name))
