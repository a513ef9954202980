"""`pipeline delete` leaves the sink table to its owner, rows and all. A new exactly-once pipeline of the same topic
into that table would read the topic from its start and meet those rows on its provenance key: it is refused
when it is created, with the reason, instead of halting on its first batch."""
import pytest
from django.db import connection

from consumers.models import ActionLog, ActionResult, Pipeline
from tests.commands import pipeline_command
from tests.conftest import drop_sink_tables

pytestmark = pytest.mark.django_db(transaction=True)  # the command closes its connection

TABLE = "reused_sink"


@pytest.fixture
def topic_exists(monkeypatch):
    monkeypatch.setattr("consumers.kafka.admin.partitions_for", lambda *args, **kwargs: [0])
    yield
    drop_sink_tables([TABLE])


def create(capsys, name, topic="orders-topic"):
    return pipeline_command(capsys, "create", name, "--topic", topic, "--sink-table", TABLE, "--create-table")


def test_a_new_pipeline_into_a_table_holding_rows_of_its_topic_is_refused_and_nothing_is_created(
        capsys, topic_exists):
    assert create(capsys, "orders")[0] == 0
    with connection.cursor() as cursor:   # what the first pipeline wrote
        cursor.execute(f"INSERT INTO {TABLE} (id, source_topic, source_partition, source_offset) "
                       "VALUES (1, 'orders-topic', 0, 0)")
    assert pipeline_command(capsys, "delete", "orders")[0] == 0

    code, _, err = create(capsys, "orders-again")

    assert code == 1 and "already holds rows of topic 'orders-topic'" in err
    assert not Pipeline.objects.filter(name="orders-again").exists()
    assert ActionLog.objects.filter(result=ActionResult.REFUSED, message__contains="already holds rows").exists()
    assert create(capsys, "other-topic", topic="other-topic")[0] == 0   # the same table, another topic's rows


def test_a_table_without_provenance_columns_is_refused_for_them_not_by_a_database_error(capsys, topic_exists):
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (id bigint)")
    for transform in ("int_value", "no_such_transform"):   # an unknown transform skips the sink table's checks
        code, _, err = pipeline_command(capsys, "create", "orders", "--topic", "orders-topic",
                                        "--sink-table", TABLE, "--transform", transform)
        assert code == 1 and "Traceback" not in err, err
    assert not Pipeline.objects.exists()
