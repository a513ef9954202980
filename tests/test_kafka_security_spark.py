"""The Spark engine on a TLS + SASL/SCRAM cluster (the forwarders of tests/kafka_forwarders.py): the driver, the
source's Python workers and the executors all connect through TLS and authenticate; what Spark is given holds
where the password is, never the password."""
import json
import uuid

import pytest
from django.db import connection
from kafka.admin import NewTopic
from psycopg2 import sql

from consumers.engine.spark import run_pipeline
from consumers.engine.spark_session import get_spark
from consumers.engine.spark_source import cluster_options
from consumers.kafka import admin as kafka_admin
from consumers.kafka import clusters
from consumers.models import Engine
from consumers.reconciliation import topic_check
from tests.chaos import sink_counts
from tests.conftest import drop_sink_tables
from tests.kafka_forwarders import PASSWORD
from tests.pipelines import create_pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture
def secure_cluster(transactional_db, tmp_path, settings, pki, secure_broker):
    # A password file: Spark's Python workers read it where they run (an environment variable set now would
    # not reach workers a JVM started earlier in this process).
    (tmp_path / "password").write_text(PASSWORD)
    (tmp_path / "clusters.toml").write_text(f"""
[clusters.secure]
bootstrap_servers = "{secure_broker.bootstrap}"
security_protocol = "SASL_SSL"
ssl_cafile = "{pki.ca_file}"
sasl_mechanism = "SCRAM-SHA-256"
sasl_username = "tally"
sasl_password_file = "password"
""")
    settings.TALLY_KAFKA_CLUSTERS = str(tmp_path / "clusters.toml")
    tables = []
    yield tables
    drop_sink_tables(tables)


def test_a_spark_pipeline_on_a_tls_and_scram_cluster_writes_every_record_once(secure_cluster, secure_broker):
    get_spark()
    topic = f"spark-secure-{uuid.uuid4().hex[:8]}"
    with kafka_admin.admin_session("secure") as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    producer = clusters.producer("secure", acks="all")
    for value in range(1, 301):
        producer.send(topic, str(value).encode(), partition=value % 2)
    producer.flush(timeout=30)
    producer.close(timeout=5)
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), cluster="secure",
                               engine=Engine.SPARK)
    secure_cluster.append(pipeline.sink_table)
    before = len(secure_broker.forwarder.authenticated)

    result = run_pipeline(pipeline.name, batch_size=100, stop_when_caught_up=True, max_seconds=240)

    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 301)}
    assert len(secure_broker.forwarder.authenticated) > before
    assert kafka_admin.committed_offsets(pipeline.group_id, topic, cluster="secure") == {0: 150, 1: 150}
    options = cluster_options(clusters.get("secure"))
    assert PASSWORD not in json.dumps(options)
    assert json.loads(options["tally.cluster"])["sasl_password"]["file"].endswith("/password")

    # The topic check of a group Tally does not run, on the same cluster: its committed offsets come from the
    # secure cluster's coordinator and Spark reads the range through TLS + SCRAM. The group claims every record;
    # the table lost 2 and 4 and holds 3 twice.
    with connection.cursor() as cur:
        cur.execute(sql.SQL("DELETE FROM {} WHERE id IN (2, 4)").format(sql.Identifier(pipeline.sink_table))
                    .as_string(cur.cursor))
        cur.execute(sql.SQL("INSERT INTO {0} (id, source_topic, source_partition, source_offset) SELECT id, "
                            "source_topic, source_partition, source_offset + 1000 FROM {0} WHERE id = 3").format(
            sql.Identifier(pipeline.sink_table)).as_string(cur.cursor))
    kafka_admin.commit_offsets("team-loader", topic, {0: 150, 1: 150}, cluster="secure")
    report = topic_check.check_topic(topic, "team-loader", pipeline.sink_table, "id", "int_value", cluster="secure")
    assert report["offsets_source"] == "kafka" and report["records_in_range"] == 300
    assert (report["missing"], report["duplicated"], report["unexpected"]) == ([2, 4], {"3": 2}, [])
