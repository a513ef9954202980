"""Every door that creates a pipeline refuses the same sink tables by name (consumers/engine/sink_names.py): a
table of Django or Tally, a dotted name that means one, a quoted name in another schema. Nothing is created
(no pipeline, no table, no action but refusals), and Kafka is never asked: the name is refused first."""
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from consumers.models import ActionLog, ActionResult, Pipeline
from consumers.operations import pipeline_file
from tests.commands import pipeline_command
from tests.views_helpers import PASSWORD, make_operator

pytestmark = pytest.mark.django_db

TABLES = ["auth_user", "public.auth_user", '"elsewhere"."orders"', "elsewhere.orders", "pg_catalog.pg_class",
          "consumers_pipeline", "consumers_new_thing", "django_session", "knox_authtoken", "alerts_alert"]


@pytest.fixture
def world(monkeypatch):
    """No Kafka: a door that asked it would be recorded (and the name check must come first anyway)."""
    asked = []
    monkeypatch.setattr("consumers.kafka.admin.partitions_for", lambda *args, **kwargs: asked.append(args) or [0])
    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA IF NOT EXISTS elsewhere")
    before = tables()
    yield asked
    assert not asked, "Kafka was asked about a spec refused by its table's name"
    assert tables() == before
    assert not Pipeline.objects.exists()
    assert not ActionLog.objects.exclude(result=ActionResult.REFUSED).exists()
    with connection.cursor() as cursor:
        cursor.execute("DROP SCHEMA elsewhere")  # empty, as checked above


def tables() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE c.relkind = 'r' ORDER BY 1, 2")
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)  # the command closes its connection
@pytest.mark.parametrize("table", TABLES)
def test_the_command_refuses_it(world, capsys, table):
    code, _, err = pipeline_command(capsys, "create", "orders", "--topic", "orders-topic", "--sink-table", table,
                                    "--create-table")
    assert code == 1 and "sink_table" in err


@pytest.mark.parametrize("table", TABLES)
def test_the_file_refuses_it(world, tmp_path, table):
    path = tmp_path / "pipelines.toml"
    path.write_text(f'[pipelines.orders]\ntopic = "orders-topic"\nsink_table = \'{table}\'\ncreate_table = true\n')
    with pytest.raises(pipeline_file.FileRefused, match="sink_table"):
        pipeline_file.apply(str(path))


@pytest.mark.parametrize("table", TABLES)
def test_the_api_refuses_it(world, table):
    client = Client()
    client.force_login(make_operator())
    response = client.post("/api/pipelines/", {"name": "orders", "topic": "orders-topic", "sink_table": table,
                                               "create_table": True}, content_type="application/json")
    assert response.status_code == 400 and "sink_table" in response.json()["errors"], response.content


@pytest.mark.parametrize("table", TABLES)
def test_the_form_refuses_it(world, table):
    client = Client()
    client.force_login(make_operator())
    response = client.post("/pipelines/new/", {
        "name": "orders", "topic": "orders-topic", "sink_table": table, "mode": "exactly-once",
        "transform": "int_value", "engine": "python", "isolation_level": "read_committed",
        "on_log_truncated": "stop", "create_table": "on"})
    assert response.status_code == 400 and 'id="error-sink_table"' in response.content.decode()


@pytest.mark.parametrize("table", TABLES)
def test_the_admin_refuses_it(world, table):
    client = Client()
    client.force_login(User.objects.create_superuser("root", password=PASSWORD))
    response = client.post("/admin/consumers/pipeline/add/", {
        "name": "orders", "cluster": "default", "topic": "orders-topic", "sink_table": table,
        "delivery_mode": "exactly_once", "transform": "int_value", "group_id": "", "engine": "python",
        "isolation_level": "read_committed", "on_log_truncated": "stop", "parallel_runs": "1", "create_table": "on"})
    assert response.status_code == 200 and response.context["adminform"].form.errors.get("sink_table")
