"""A watch of a table in a schema other than public (`schema.table`), through the command, watches.toml, the
API and the form: validated against the catalog, audited, traced and exported from that schema's table, even
when public holds a table of the same name; and the refusals of names, schemas and tables that do not exist."""
import csv
import io
import json
import uuid

import pytest
from django.db import connection
from psycopg2 import sql

from consumers.engine import table_names
from consumers.kafka import admin
from consumers.models import Watch
from consumers.operations import watch_setup
from consumers.operations.watch_setup import WatchSpec
from consumers.reconciliation import watch_audit, watch_trace
from tests.commands import run_command
from tests.db_roles import acting_as, new_role
from tests.db_roles import execute_composed as execute
from tests.views_helpers import client_of, make_operator
from tests.watch_helpers import produce

TABLE = "team_orders"


@pytest.fixture
def sales(transactional_db):
    """A schema `sales_<hex>` with a table team_orders (id bigint, part integer, off bigint) that holds 1, 2, 2,
    4, 5 (record 3 lost, 2 duplicated), and public.team_orders with every record once: a watch audited from
    the wrong one finds nothing."""
    schema = f"sales_{uuid.uuid4().hex[:8]}"
    execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for where, ids in (((schema, TABLE), [1, 2, 2, 4, 5]), ((TABLE,), [1, 2, 3, 4, 5])):
        execute(sql.SQL("CREATE TABLE {} (id bigint, part integer, off bigint)").format(sql.Identifier(*where)))
        for i in ids:
            execute(sql.SQL("INSERT INTO {} VALUES (%s, 0, %s)").format(sql.Identifier(*where)), [i, i - 1])
    yield schema
    execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(TABLE)))


def committed_topic(make_topic) -> tuple[str, str]:
    topic = make_topic("orders")
    produce(topic, [(None, str(v).encode()) for v in range(1, 6)])
    group = f"team-{uuid.uuid4().hex[:6]}"
    admin.commit_offsets(group, topic, {0: 5})
    return topic, group


def refusal(**fields) -> str:
    spec = WatchSpec(**{"name": "w", "group": "g", "topic": "t", "record_id": "value", "row_id": "id", **fields})
    with pytest.raises(watch_setup.Invalid) as refused:
        watch_setup.validate(spec)
    return refused.value.problems["sink_table"]


@pytest.mark.parametrize(("name", "parts"), [("orders", ("orders",)), ("sales.orders", ("sales", "orders")),
                                             ("Sales.Orders", ("Sales", "Orders"))])
def test_a_name_is_a_table_or_schema_dot_table_taken_exactly_as_written(name, parts):
    assert table_names.problem(name) is None and table_names.split(name) == parts


@pytest.mark.parametrize(("name", "said"), [
    ('"sales"."orders"', "without quotes"), ("a.b.c", "more than one dot"), (".orders", "not empty"),
    ("sales.", "not empty"), ("s" * 64 + ".orders", "at most 63"), ("pg_catalog.pg_class", "PostgreSQL's own"),
    ("information_schema.tables", "PostgreSQL's own")])
def test_names_outside_the_rule_are_refused(name, said):
    assert said in table_names.problem(name)


@pytest.mark.parametrize("table", ["knox_authtoken", "public.knox_authtoken", "axes_accessattempt", "axes_accesslog",
                                   "auth_user", "consumers_watch", "alerts_channel", "django_session"])
@pytest.mark.django_db
def test_no_table_of_an_installed_app_can_be_watched(table):
    """The trace shows a watched table's rows to every viewer: API tokens and login attempts among them would leak."""
    assert "is not a table a consumer of yours writes (the " in refusal(sink_table=table, row_id="user_id")


@pytest.mark.django_db
def test_the_api_refuses_a_watch_of_the_api_token_table_and_creates_nothing():
    answer = client_of(make_operator()).post(
        "/api/watches/", {"name": "tokens", "group": "g", "topic": "t", "sink_table": "knox_authtoken",
                          "record_id": "value", "row_id": "user_id"}, content_type="application/json")
    assert answer.status_code == 400 and "sink_table" in answer.json()["errors"], answer.content
    assert not Watch.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_missing_schema_or_a_table_missing_in_its_schema_is_refused(sales):
    assert refusal(sink_table=f"nosuch_{uuid.uuid4().hex[:6]}.{TABLE}").startswith("schema 'nosuch_")
    assert "does not exist" in refusal(sink_table="nosuch_x.orders")
    missing = refusal(sink_table=f"{sales}.other_table")
    assert missing.startswith(f"table 'other_table' does not exist in schema '{sales}'")
    assert "without quotes" in refusal(sink_table=f'"{sales}".{TABLE}')
    assert "not a table a consumer of yours writes" in refusal(sink_table="public.consumers_watch")
    assert "PostgreSQL's own" in refusal(sink_table="pg_catalog.pg_class")
    assert not Watch.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_database_user_without_usage_on_the_schema_or_select_on_the_table_is_told_the_grant(sales):
    with new_role("limited") as role:
        execute(sql.SQL("GRANT SELECT ON consumers_watch TO {}").format(role))  # the name's uniqueness check
        with acting_as(role):
            no_usage = refusal(sink_table=f"{sales}.{TABLE}")
        execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(sales), role))
        with acting_as(role):
            no_select = refusal(sink_table=f"{sales}.{TABLE}")
    assert no_usage == (f"the database user may not use schema {sales!r}: GRANT USAGE ON SCHEMA \"{sales}\" to "
                        "Tally's database user")
    assert no_select == (f"the database user may not read '{sales}.{TABLE}': GRANT SELECT ON it to Tally's "
                         "database user")


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_command_audits_the_schema_table_not_public_and_traces_it(make_topic, sales, capsys, tmp_path):
    topic, group = committed_topic(make_topic)
    base = ["--group", group, "--topic", topic, "--record-id", "value", "--row-id", "id"]
    code, out, err = run_command(capsys, "watch", "create", "in-sales", *base, "--sink-table", f"{sales}.{TABLE}")
    assert code == 0 and f"auditing {sales}.{TABLE}" in out, (out, err)
    assert run_command(capsys, "watch", "create", "in-public", *base, "--sink-table", f"public.{TABLE}")[0] == 0
    assert run_command(capsys, "watch", "create", "plain", *base, "--sink-table", TABLE)[0] == 0
    code, out, err = run_command(capsys, "watch", "create", "nope", *base, "--sink-table", f"{sales}.nope")
    assert code == 1 and f"table 'nope' does not exist in schema '{sales}'" in err
    toml = tmp_path / "watches.toml"
    toml.write_text(f'[watches.by-offset]\ngroup = "{group}"\ntopic = "{topic}"\nsink_table = "{sales}.{TABLE}"\n'
                    'record_id = "offset"\nrow_id = "part,off"\n')
    assert run_command(capsys, "watch", "apply", str(toml))[0] == 0
    assert run_command(capsys, "watch", "apply", str(toml))[0] == 0   # idempotent: the same name, unchanged
    assert Watch.objects.get(name="by-offset").sink_table == f"{sales}.{TABLE}"

    code, out, _ = run_command(capsys, "watch", "check", "in-sales", "--settle-seconds", "0", "--json")
    report = json.loads(out)
    assert code == 1 and (report["checked"], report["lost"], report["duplicated"]) == (5, 1, 1)
    assert report["lost_offsets"] == [{"partition": 0, "offset": 2}]
    assert report["duplicated_offsets"] == [{"partition": 0, "offset": 1}]
    code, out, _ = run_command(capsys, "watch", "check", "by-offset", "--settle-seconds", "0", "--json")
    assert code == 1 and json.loads(out)["lost_offsets"] == [{"partition": 0, "offset": 2}]
    for clean in ("in-public", "plain"):   # public.team_orders holds every record once
        code, out, _ = run_command(capsys, "watch", "check", clean, "--settle-seconds", "0", "--json")
        assert code == 0 and (json.loads(out)["lost"], json.loads(out)["duplicated"]) == (0, 0)

    watch = Watch.objects.get(name="in-sales")
    with connection.cursor() as cur:
        assert watch_audit.tables_gone(cur.cursor, [watch]) == set()
    lost, twice = watch_trace.trace(watch, 0, 2), watch_trace.trace(watch, 0, 1)
    assert (lost.verdict, lost.rows_found) == ("lost", 0)
    assert (twice.verdict, twice.rows_found) == ("duplicated", 2)
    rows = list(csv.reader(io.StringIO("".join(watch_trace.findings_csv(watch)))))
    assert [(r[1], r[2]) for r in rows[1:]] == [("1", "duplicated"), ("2", "lost")]

    execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(sales, TABLE)))   # public's is still there
    with connection.cursor() as cur:
        assert watch_audit.tables_gone(cur.cursor, [watch]) == {watch.pk}


@pytest.mark.kafka
@pytest.mark.django_db(transaction=True)
def test_the_api_and_the_form_create_a_watch_of_a_schema_table(make_topic, sales):
    topic, group = committed_topic(make_topic)
    operator = client_of(make_operator())
    body = {"name": "api-sales", "group": group, "topic": topic, "sink_table": f"{sales}.{TABLE}",
            "record_id": "value", "row_id": "id", "settle_seconds": 0}
    for bad, said in (("nosuch_schema_x.orders", "schema 'nosuch_schema_x' does not exist"),
                      (f"{sales}.nope", f"table 'nope' does not exist in schema '{sales}'")):
        refused = operator.post("/api/watches/", {**body, "sink_table": bad}, content_type="application/json")
        assert refused.status_code == 400 and said in refused.json()["errors"]["sink_table"][0]["message"]
    assert not Watch.objects.exists()
    created = operator.post("/api/watches/", body, content_type="application/json")
    assert created.status_code == 201 and created.json()["sink_table"] == f"{sales}.{TABLE}", created.content
    checked = operator.post("/api/watches/api-sales/check", {}, content_type="application/json").json()
    assert (checked["lost"], checked["duplicated"]) == (1, 1)
    assert checked["lost_offsets"] == [{"partition": 0, "offset": 2}]
    assert checked["duplicated_offsets"] == [{"partition": 0, "offset": 1}]
    traced = operator.get("/api/watches/api-sales/trace?partition=0&offset=1").json()
    assert (traced["verdict"], traced["rows_found"]) == ("duplicated", 2)
    exported = operator.get("/api/watches/api-sales/findings.csv")
    assert b"0,2,lost" in b"".join(exported.streaming_content)

    form = {"name": "form-sales", "group": group, "topic": topic, "record_id": "value", "row_id": "id",
            "start_from": "earliest", "settle_seconds": 0}
    refused = operator.post("/watches/new/", {**form, "sink_table": f"{sales}.nope"})
    assert refused.status_code == 400 and "does not exist in schema" in refused.content.decode()
    created = operator.post("/watches/new/", {**form, "sink_table": f"{sales}.{TABLE}"})
    assert created.status_code == 302 and Watch.objects.get(name="form-sales").sink_table == f"{sales}.{TABLE}"
    report = watch_audit.check_watch(Watch.objects.get(name="form-sales"), settle_seconds=0)
    assert (report.lost, report.duplicated) == (1, 1)
