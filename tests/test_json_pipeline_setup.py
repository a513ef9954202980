"""`pipeline create --transform json --map ... --upsert-key ... --delete-on-tombstone` and the same through the
declarative file: validated against the real table and broker, refused with the SQL that fixes the table, the
file applied idempotently."""
import html

import pytest
from django.db import connection

from consumers.models import ActionLog, Pipeline
from tests.commands import pipeline_command as run_command

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

ORDERS_DDL = ("CREATE TABLE {} (order_id bigint NOT NULL, customer text, amount numeric(10,2), "
              "ordered_at timestamptz, source_topic text NOT NULL, source_partition integer NOT NULL, "
              "source_offset bigint NOT NULL{})")


@pytest.fixture
def topic(make_topic):
    return make_topic("orders", partitions=1)


def create_table(name, constraint=", UNIQUE (source_topic, source_partition, source_offset)"):
    with connection.cursor() as cursor:
        cursor.execute(ORDERS_DDL.format(f'"{name}"', constraint))  # test-only: a generated, quoted name


def test_create_stores_the_mapping_and_show_prints_it(capsys, topic, table):
    create_table(table)
    code, out, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                                 "--transform", "json", "--map", "order_id=id", "--map", "customer=customer.name")
    assert code == 0, err
    pipeline = Pipeline.objects.get(name="orders")
    assert pipeline.json_map == {"order_id": "id", "customer": "customer.name"} and pipeline.upsert_key == []
    code, out, _ = run_command(capsys, "show", "orders", "--json")
    assert '"order_id": "id"' in out


def test_a_table_whose_own_id_is_an_identity_takes_a_json_pipeline(capsys, topic, table):
    # An identity has no default in the catalog (atthasdef), so its NOT NULL column was called one the transform must
    # write, and every door refused the table: 'columns id ... are NOT NULL without a default'.
    create_table(table, constraint=", id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                                   "UNIQUE (source_topic, source_partition, source_offset)")
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--map", "order_id=id")
    assert code == 0, err
    assert Pipeline.objects.get(name="orders").json_map == {"order_id": "id"}


def test_a_mapping_that_does_not_fit_the_table_is_refused_and_nothing_is_created(capsys, topic, table):
    create_table(table)
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--map", "order_total=total", "--map", "customer=@when")
    assert code == 1
    assert "no column 'order_total'" in err and "unknown source '@when'" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--map", "no_equals_sign")
    assert code == 2 and "COLUMN=SOURCE" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", "missing_tbl",
                               "--transform", "json")
    assert code == 1 and "does not exist" in err
    assert not Pipeline.objects.exists() and not ActionLog.objects.filter(action="create", result="done").exists()


def test_upsert_without_a_unique_constraint_on_the_key_is_refused_with_the_sql_that_fixes_it(capsys, topic, table):
    create_table(table, constraint="")
    argv = ["create", "orders", "--topic", topic, "--sink-table", table, "--transform", "json",
            "--map", "order_id=@key", "--upsert-key", "order_id", "--delete-on-tombstone"]
    code, _, err = run_command(capsys, *argv)
    assert code == 1 and not Pipeline.objects.exists()
    fix = f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_upsert_key" UNIQUE ("order_id");'
    assert fix in err
    with connection.cursor() as cursor:
        cursor.execute(fix)
    code, out, err = run_command(capsys, *argv)
    assert code == 0, err
    pipeline = Pipeline.objects.get(name="orders")
    assert pipeline.upsert_key == ["order_id"] and pipeline.delete_on_tombstone and pipeline.is_upsert


def test_a_deferrable_unique_key_on_the_upsert_key_is_refused_with_the_sql_that_fixes_it(capsys, topic, table):
    # ON CONFLICT cannot use a DEFERRABLE key as its arbiter (55000): the pipeline was created, and each of its
    # batches was refused as SinkError.
    create_table(table, constraint=", UNIQUE (order_id) DEFERRABLE")
    argv = ["create", "orders", "--topic", topic, "--sink-table", table, "--transform", "json",
            "--map", "order_id=@key", "--upsert-key", "order_id"]
    code, _, err = run_command(capsys, *argv)
    assert code == 1 and not Pipeline.objects.exists()
    fix = f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_upsert_key" UNIQUE ("order_id");'
    assert fix in err
    with connection.cursor() as cursor:
        cursor.execute(fix)
    code, _, err = run_command(capsys, *argv)
    assert code == 0, err


def test_tombstones_need_the_key_from_the_record_key_and_an_upsert_key(capsys, topic, table):
    create_table(table, constraint=", UNIQUE (order_id)")
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--upsert-key", "order_id", "--delete-on-tombstone")
    assert code == 1 and "@key" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--delete-on-tombstone")
    assert code == 1 and "need an upsert key" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "json", "--upsert-key", "nope")
    assert code == 1 and "not written by transform 'json'" in err
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table,
                               "--transform", "int_value", "--map", "id=x")
    assert code == 1 and "--transform json only" in err
    assert not Pipeline.objects.exists()


def write(tmp_path, text):
    path = tmp_path / "pipelines.toml"
    path.write_text(text)
    return str(path)


def test_the_file_applies_a_mapping_once_then_changes_nothing_and_changes_the_mapping_when_asked(
        capsys, tmp_path, topic, table):
    create_table(table, constraint=", UNIQUE (order_id)")
    body = (f'[pipelines.orders]\ntopic = "{topic}"\nsink_table = "{table}"\ntransform = "json"\n'
            'upsert_key = ["order_id"]\ndelete_on_tombstone = true\n')
    path = write(tmp_path, body + 'map = { order_id = "@key", customer = "customer.name" }\n')
    code, out, err = run_command(capsys, "apply", path)
    assert code == 0 and "created 1, updated 0, 0 unchanged." in out, err
    pipeline = Pipeline.objects.get(name="orders")
    assert pipeline.json_map == {"order_id": "@key", "customer": "customer.name"}
    assert pipeline.upsert_key == ["order_id"] and pipeline.delete_on_tombstone
    code, out, err = run_command(capsys, "apply", path)
    assert code == 0 and "unchanged orders" in out and "created 0, updated 0, 1 unchanged." in out
    assert ActionLog.objects.filter(pipeline=pipeline).count() == 1
    path = write(tmp_path, body + 'map = { order_id = "@key", customer = "buyer" }\n')
    code, out, err = run_command(capsys, "apply", path)
    assert code == 0, err
    assert Pipeline.objects.get(name="orders").json_map == {"order_id": "@key", "customer": "buyer"}
    code, out, err = run_command(capsys, "apply", write(tmp_path, body.replace('["order_id"]', '["customer"]')
                                                        + 'map = { order_id = "@key", customer = "buyer" }\n'))
    assert code == 1 and "upsert_key" in err
    assert Pipeline.objects.get(name="orders").upsert_key == ["order_id"]


def test_the_file_refuses_a_mapping_that_is_not_a_table_of_text(capsys, tmp_path, topic, table):
    create_table(table)
    path = write(tmp_path, f'[pipelines.orders]\ntopic = "{topic}"\nsink_table = "{table}"\ntransform = "json"\n'
                           'map = { order_id = 5 }\n')
    code, _, err = run_command(capsys, "apply", path)
    assert code == 1 and "orders.map" in err and not Pipeline.objects.exists()


def test_every_door_refuses_an_upsert_table_without_a_unique_key_on_it_and_gives_the_sql_that_fixes_it(
        capsys, tmp_path, topic, table, operator_client):
    create_table(table)  # unique on the provenance, not on the upsert key
    fix = f'ALTER TABLE "{table}" ADD CONSTRAINT "{table}_upsert_key" UNIQUE ("order_id");'
    path = write(tmp_path, f'[pipelines.orders]\ntopic = "{topic}"\nsink_table = "{table}"\ntransform = "json"\n'
                           'upsert_key = ["order_id"]\nmap = { order_id = "@key" }\n')
    code, _, err = run_command(capsys, "apply", path)
    assert code == 1 and fix in err
    fields = {"name": "orders", "topic": topic, "sink_table": table, "mode": "exactly-once", "transform": "json",
              "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "stop"}
    response = operator_client.post("/api/pipelines/",
                                    {**fields, "map": {"order_id": "@key"}, "upsert_key": ["order_id"]},
                                    content_type="application/json")
    assert response.status_code == 400 and fix in response.json()["errors"]["upsert_key"][0]["message"]
    page = operator_client.post("/pipelines/new/", {**fields, "group": "", "map": "order_id=@key",
                                                    "upsert_key": "order_id"})
    assert page.status_code == 400 and html.escape(fix, quote=True) in page.content.decode()
    assert not Pipeline.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute(fix)
    code, _, err = run_command(capsys, "apply", path)
    assert code == 0, err
    assert Pipeline.objects.get(name="orders").upsert_key == ["order_id"]


def test_a_json_upsert_pipeline_changed_in_the_admin_keeps_its_map_and_key(capsys, topic, table):
    from django.contrib.auth.models import User
    from django.test import Client

    create_table(table, constraint=", UNIQUE (order_id)")
    code, _, err = run_command(capsys, "create", "orders", "--topic", topic, "--sink-table", table, "--transform",
                               "json", "--map", "order_id=@key", "--map", "customer=customer.name",
                               "--upsert-key", "order_id", "--delete-on-tombstone")
    assert code == 0, err
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="pw-root-123"))
    pipeline = Pipeline.objects.get(name="orders")
    change = f"/admin/consumers/pipeline/{pipeline.pk}/change/"
    form = {"transform": "json", "engine": "python", "isolation_level": "read_committed", "on_log_truncated": "skip",
            "parallel_runs": "1", "kafka_client": "", "json_map": '{"order_id": "@key", "customer": "customer.name"}'}
    saved = admin.post(change, form)
    assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.context else saved
    pipeline.refresh_from_db()
    assert pipeline.on_log_truncated == "skip"
    assert (pipeline.json_map, pipeline.upsert_key, pipeline.delete_on_tombstone) == (
        {"order_id": "@key", "customer": "customer.name"}, ["order_id"], True)
    remapped = admin.post(change, {**form, "json_map": '{"order_id": "@key", "amount": "total"}'})
    assert remapped.status_code == 302
    pipeline.refresh_from_db()
    assert pipeline.json_map == {"order_id": "@key", "amount": "total"}   # what was typed, not ignored
    update = ActionLog.objects.filter(action="update").order_by("pk").last()
    assert "customer" in update.message and "amount" in update.message
