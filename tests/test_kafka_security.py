"""TLS, mutual TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER) against the embedded broker behind
forwarders of ours (tests/kafka_forwarders.py), with certificates made in the test (tests/pki.py): `kafka check`, a
pipeline end to end, groups, and every failure a person must be able to act on, with no secret in any output."""
import uuid

import pytest
from kafka.admin import NewTopic

from consumers.engine.python import run_pipeline
from consumers.kafka import admin as kafka_admin
from consumers.kafka import broker, clusters
from consumers.models import ActionLog, ClusterStatus, ConsumerRun, Pipeline
from consumers.operations import groups
from tests.chaos import sink_counts
from tests.commands import run_command
from tests.conftest import drop_sink_tables
from tests.kafka_forwarders import KEY_PASSWORD, PASSWORD, ForwardedBroker, Forwarder, server_tls
from tests.pipelines import create_pipeline

pytestmark = [pytest.mark.kafka]

WRONG = "wrong-horse-battery-staple-9"


@pytest.fixture(scope="module")
def mtls_broker(pki):
    """Mutual TLS: the forwarder refuses a client without a certificate signed by the test CA (as Aiven)."""
    with ForwardedBroker(tls=server_tls(pki, require_client_certificate=True)) as forwarded:
        yield forwarded


@pytest.fixture(scope="module")
def scram_256_only(pki, secure_broker):
    """Another door to the secure broker that offers SASL SCRAM-SHA-256 only (as a cluster not configured for
    SCRAM-SHA-512): a client asking for another mechanism is refused at its first connection."""
    forwarder = Forwarder(broker.free_port(), secure_broker.broker_port, tls=server_tls(pki),
                          users={"tally": PASSWORD}, mechanisms=("SCRAM-SHA-256",)).start()
    yield f"localhost:{forwarder.port}"
    forwarder.stop()


@pytest.fixture
def clusters_file(tmp_path, settings, monkeypatch, pki, secure_broker, mtls_broker, scram_256_only):
    """A clusters file with the right settings for each broker, and one wrong setting per failure."""
    monkeypatch.setenv("SECURE_PASSWORD", PASSWORD)
    monkeypatch.setenv("WRONG_PASSWORD", WRONG)
    (tmp_path / "key-password").write_text(KEY_PASSWORD + "\n")
    (tmp_path / "token").write_text(PASSWORD + "\n")
    (tmp_path / "wrong-token").write_text(WRONG)
    scram = f'''
bootstrap_servers = "{secure_broker.bootstrap}"
security_protocol = "SASL_SSL"
ssl_cafile = "{pki.ca_file}"
sasl_username = "tally"
'''
    mtls = f'''
bootstrap_servers = "{mtls_broker.bootstrap}"
security_protocol = "SSL"
ssl_cafile = "{pki.ca_file}"
'''
    one_down = scram.replace(secure_broker.bootstrap, f"{secure_broker.bootstrap},localhost:1")   # one of two
    path = tmp_path / "clusters.toml"
    path.write_text(f'''
[clusters.secure]{scram}sasl_mechanism = "SCRAM-SHA-256"
sasl_password_env = "SECURE_PASSWORD"

[clusters.scram-512]{scram}sasl_mechanism = "SCRAM-SHA-512"
sasl_password_env = "SECURE_PASSWORD"

[clusters.plain]{scram}sasl_mechanism = "PLAIN"
sasl_password_env = "SECURE_PASSWORD"

[clusters.oauth]{scram}sasl_mechanism = "OAUTHBEARER"
sasl_oauth_token_file = "token"

[clusters.wrong-token]{scram}sasl_mechanism = "OAUTHBEARER"
sasl_oauth_token_file = "wrong-token"

[clusters.wrong-password]{scram}sasl_mechanism = "SCRAM-SHA-256"
sasl_password_env = "WRONG_PASSWORD"

[clusters.wrong-password-512]{scram}sasl_mechanism = "SCRAM-SHA-512"
sasl_password_env = "WRONG_PASSWORD"

[clusters.wrong-password-one-down]{one_down}sasl_mechanism = "SCRAM-SHA-256"
sasl_password_env = "WRONG_PASSWORD"

[clusters.wrong-mechanism]{scram.replace(secure_broker.bootstrap, scram_256_only)}sasl_mechanism = "SCRAM-SHA-512"
sasl_password_env = "SECURE_PASSWORD"

[clusters.wrong-ca]{scram.replace(str(pki.ca_file), str(pki.other_ca_file))}sasl_mechanism = "SCRAM-SHA-256"
sasl_password_env = "SECURE_PASSWORD"

[clusters.wrong-host]{scram.replace("localhost", "127.0.0.1")}sasl_mechanism = "SCRAM-SHA-256"
sasl_password_env = "SECURE_PASSWORD"

[clusters.mtls]{mtls}ssl_certfile = "{pki.client_cert}"
ssl_keyfile = "{pki.client_key}"
ssl_password_file = "key-password"

[clusters.no-client-cert]{mtls}
[clusters.unreachable]
bootstrap_servers = "localhost:1"
''')
    settings.TALLY_KAFKA_CLUSTERS = str(path)
    return path


@pytest.mark.parametrize(("cluster", "mechanism"), [("secure", "SCRAM-SHA-256"), ("scram-512", "SCRAM-SHA-512")])
def test_kafka_check_walks_tls_and_scram_and_prints_brokers_topics_and_mechanism(transactional_db, clusters_file,
                                                                                 secure_broker, capsys, cluster,
                                                                                 mechanism):
    before = len(secure_broker.forwarder.authenticated)
    code, out, err = run_command(capsys, "kafka", "check", cluster)
    assert (code, err) == (0, "")
    for step in ("settings", "resolve", "connect", "tls", "authenticate", "metadata"):
        assert f"  {step:<13}ok" in out
    assert f"brokers      {secure_broker.bootstrap} (id " in out
    assert f"mechanism    SASL {mechanism}" in out
    assert ("tally", mechanism) in secure_broker.forwarder.authenticated[before:]


@pytest.mark.parametrize(("cluster", "step", "cause", "detail"), [
    ("wrong-password", "authenticate", "authentication", "the broker refused user 'tally' with SCRAM-SHA-256"),
    ("wrong-password-512", "authenticate", "authentication", "the broker refused user 'tally' with SCRAM-SHA-512"),
    ("wrong-mechanism", "authenticate", "authentication",
     "the broker does not offer SASL SCRAM-SHA-512 (it offers SCRAM-SHA-256)"),
    ("wrong-ca", "tls", "TLS verification", "the broker's certificate is not trusted by ssl_cafile"),
    ("wrong-host", "tls", "TLS verification", "the broker's certificate does not name '127.0.0.1'"),
    ("no-client-cert", "tls", "TLS verification", "may require a client certificate"),
    ("unreachable", "connect", "unreachable", "no broker accepts connections at localhost:1"),
])
def test_kafka_check_says_which_step_failed_and_why_and_exits_1(transactional_db, clusters_file, capsys, cluster,
                                                               step, cause, detail):
    code, out, err = run_command(capsys, "kafka", "check", cluster)
    assert code == 1
    assert err.startswith(f"CommandError: Kafka cluster {cluster!r}: {cause} ({step} failed): ")
    assert detail in err
    assert f"  {step:<13}FAILED: {cause}: " in out
    assert PASSWORD not in out + err and WRONG not in out + err
    remembered = ClusterStatus.objects.get(name=cluster)   # for the Clusters page
    assert not remembered.reachable and detail in remembered.last_error


def test_with_a_bootstrap_server_down_a_refused_password_is_the_failure_shown_after_the_steps_that_passed(
        transactional_db, clusters_file, capsys):
    """Several bootstrap servers, the last one down: the check names the furthest step a server reached (the
    password refused), not the last server's failure, and prints the steps that passed before it."""
    code, out, err = run_command(capsys, "kafka", "check", "wrong-password-one-down")
    assert code == 1
    assert err.startswith("CommandError: Kafka cluster 'wrong-password-one-down': authentication (authenticate "
                          "failed): the broker refused user 'tally' with SCRAM-SHA-256"), err
    for step in ("settings", "resolve", "connect", "tls"):
        assert f"  {step:<13}ok" in out
    assert "  authenticate FAILED: authentication: " in out
    assert PASSWORD not in out + err and WRONG not in out + err


def test_an_oauthbearer_token_from_its_file_authenticates_and_a_wrong_one_is_refused(transactional_db,
                                                                                   clusters_file, capsys,
                                                                                   secure_broker):
    code, out, err = run_command(capsys, "kafka", "check", "oauth")
    assert (code, err) == (0, ""), out
    assert "mechanism    SASL OAUTHBEARER" in out
    assert ("tally", "OAUTHBEARER") in secure_broker.forwarder.authenticated
    code, out, err = run_command(capsys, "kafka", "check", "wrong-token")
    assert code == 1 and "authentication (authenticate failed)" in err
    assert PASSWORD not in out + err and WRONG not in out + err


def test_plain_and_mutual_tls_with_an_encrypted_client_key_pass_the_check(transactional_db, clusters_file, capsys,
                                                                           secure_broker):
    assert run_command(capsys, "kafka", "check", "plain")[0] == 0
    assert ("tally", "PLAIN") in secure_broker.forwarder.authenticated
    code, out, _ = run_command(capsys, "kafka", "check", "mtls")
    assert code == 0 and "mechanism    TLS client certificate" in out


def topic_with_values(cluster: str) -> str:
    """A topic on `cluster` holding values 1..40 over two partitions, produced through its TLS and SASL."""
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    with kafka_admin.admin_session(cluster) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    producer = clusters.producer(cluster, acks="all")
    for value in range(1, 41):
        producer.send(topic, str(value).encode(), partition=value % 2)
    producer.flush(timeout=30)
    producer.close(timeout=5)
    return topic


@pytest.fixture
def secure_topic(clusters_file):
    """A topic on the secure cluster holding values 1..40 over two partitions, produced through TLS + SCRAM."""
    return topic_with_values("secure")


@pytest.fixture
def made_pipelines(transactional_db):
    tables = []
    yield tables
    drop_sink_tables(tables)


@pytest.mark.parametrize(("cluster", "mechanism"), [("secure", "SCRAM-SHA-256"), ("scram-512", "SCRAM-SHA-512")])
def test_a_pipeline_on_a_tls_and_scram_cluster_runs_end_to_end_and_reconciles(secure_topic, made_pipelines,
                                                                               secure_broker, cluster, mechanism):
    from consumers.reconciliation.reconcile import reconcile_pipeline

    pipeline = create_pipeline(secure_topic, secure_topic, f"sink_{secure_topic}".replace("-", "_"),
                               cluster=cluster, batch_size=7)
    made_pipelines.append(pipeline.sink_table)
    before = len(secure_broker.forwarder.authenticated)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 41)}
    assert ("tally", mechanism) in secure_broker.forwarder.authenticated[before:]   # the run's connections
    report = reconcile_pipeline(pipeline)
    assert (report.lost, report.duplicated, report.lag_records, report.status) == (0, 0, 0, "OK"), report.errors
    # Kafka's advisory copy went to the secure cluster's group.
    assert kafka_admin.committed_offsets(pipeline.group_id, secure_topic, cluster=cluster) == {0: 20, 1: 20}


def test_a_run_on_a_wrong_password_ends_failed_with_the_reason_and_no_secret(clusters_file, secure_topic,
                                                                            made_pipelines, caplog):
    pipeline = create_pipeline("wrong-" + secure_topic, secure_topic, f"sink_w_{secure_topic}".replace("-", "_"),
                               cluster="wrong-password")
    made_pipelines.append(pipeline.sink_table)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "error"
    assert ("Kafka cluster 'wrong-password': authentication (authenticate failed): the broker refused user "
            "'tally' with SCRAM-SHA-256") in result.detail
    run = ConsumerRun.objects.get(pk=result.run_id)
    # Crashed, not failed for good: the supervisor restarts it with backoff (a password file may be fixed).
    assert run.state == "crashed" and "authentication (authenticate failed)" in run.end_reason
    logged = caplog.text + result.detail
    assert WRONG not in logged and PASSWORD not in logged


def test_groups_on_a_secure_cluster_are_described_with_their_lag(db, secure_topic):
    group = f"billing-{uuid.uuid4().hex[:6]}"
    kafka_admin.commit_offsets(group, secure_topic, {0: 5, 1: 20}, cluster="secure")
    assert group in groups.list_groups(cluster="secure")
    report = groups.describe(group, cluster="secure")
    assert report.errors == []
    assert report.cluster == "secure"
    assert {p.partition: p.lag_records for p in report.partitions} == {0: 15, 1: 0}


def test_after_failures_no_password_is_in_logs_pages_the_api_or_the_action_log(clusters_file, made_pipelines,
                                                                              secure_topic, caplog, capsys):
    """Every door, after a wrong password, a wrong mechanism and a wrong CA: the secrets appear nowhere."""
    from django.core.management import CommandError, call_command
    from django.test import Client

    from tests.views_helpers import make_operator

    # A run that cannot authenticate; pipeline creation, a group reset and checks through the doors.
    pipeline = create_pipeline("leak-" + secure_topic, secure_topic, f"sink_l_{secure_topic}".replace("-", "_"),
                               cluster="wrong-password")
    made_pipelines.append(pipeline.sink_table)
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "error"
    for name in ("wrong-password", "wrong-mechanism", "wrong-ca", "secure"):
        run_command(capsys, "kafka", "check", name)
    run_command(capsys, "kafka", "clusters", "--json")
    with pytest.raises(CommandError) as refused:
        call_command("pipeline", "create", "leak-two", "--topic", secure_topic, "--sink-table", "leak_two",
                     "--cluster", "wrong-password", "--create-table")
    assert "cannot use Kafka to check topic" in str(refused.value) and "authentication" in str(refused.value)
    code, _, err = run_command(capsys, "watch", "create", "leak-watch", "--group", "billing", "--topic", secure_topic,
                               "--cluster", "wrong-password")
    assert code == 1 and "authentication (authenticate failed)" in err
    client = Client()
    client.force_login(make_operator())
    created = client.post("/api/pipelines/", {"name": "leak-three", "topic": secure_topic, "cluster": "wrong-password",
                                              "sink_table": "leak_three", "create_table": True},
                          content_type="application/json")
    assert created.status_code in (400, 422, 503) and "authentication" in created.content.decode(), created.content
    seen = [created] + [client.get(url) for url in ("/clusters/", "/api/clusters/", "/groups/", "/api/groups/",
                                        f"/pipelines/{pipeline.name}/", f"/api/pipelines/{pipeline.name}/",
                                        "/groups/billing/?cluster=wrong-password",
                                        "/api/groups/billing/?cluster=wrong-password", "/action-log/",
                                        "/api/action-log", "/metrics")]
    seen.append(client.post("/api/groups/billing/reset?cluster=wrong-password",
                            {"topic": secure_topic, "mode": "to-earliest", "execute": True},
                            content_type="application/json"))
    # Every door answers; the reset says Kafka cannot be used (503, audited) rather than failing.
    assert all(response.status_code < 500 for response in seen[:-1]), [r.status_code for r in seen]
    assert seen[-1].status_code == 503 and "authentication" in seen[-1].json()["error"], seen[-1].content
    clusters_page = seen[0].content.decode()
    assert "wrong-password" in clusters_page and "authentication (authenticate failed)" in clusters_page
    out, err = capsys.readouterr()
    texts = [caplog.text, out, err] + [response.content.decode() for response in seen]
    texts += [repr(list(model.objects.values())) for model in (ActionLog, ClusterStatus, ConsumerRun)]
    for text in texts:
        for secret in (PASSWORD, WRONG, KEY_PASSWORD):
            assert secret not in text


def test_a_watch_on_a_tls_and_scram_cluster_finds_what_a_foreign_consumer_lost(transactional_db, clusters_file,
                                                                                secure_topic, capsys, secure_broker):
    """A team's group on the secure cluster (its offsets committed there) and the table it wrote: the watch
    reads the committed offsets and the records through TLS + SCRAM and names the lost and duplicated ones."""
    import json

    from django.db import connection
    from psycopg2 import sql

    table = f"team_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(table)
    with connection.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {} (id bigint)").format(ident).as_string(cur.cursor))
        # Values 1..40: v went to partition v % 2 at offset (v - 1) // 2. Lost 6 (p0 @2), wrote 7 (p1 @3) twice.
        written = [v for v in range(1, 41) if v != 6] + [7]
        cur.execute(sql.SQL("INSERT INTO {} (id) SELECT unnest(%s::bigint[])").format(ident).as_string(cur.cursor),
                    [written])
    try:
        kafka_admin.commit_offsets("team-loader", secure_topic, {0: 20, 1: 20}, cluster="secure")
        assert run_command(capsys, "watch", "create", "secure-watch", "--group", "team-loader", "--topic",
                           secure_topic, "--cluster", "secure", "--sink-table", table, "--record-id", "value",
                           "--row-id", "id", "--settle-seconds", "0")[0] == 0
        # The forwarder fronts the same broker as the default cluster: only its log of authentications shows
        # that the check itself went through TLS + SCRAM.
        before = len(secure_broker.forwarder.authenticated)
        code, out, err = run_command(capsys, "watch", "check", "secure-watch", "--json")
        report = json.loads(out)
        assert code == 1, err
        assert (report["checked"], report["lost"], report["duplicated"]) == (40, 1, 1)
        assert report["lost_offsets"] == [{"partition": 0, "offset": 2}]
        assert report["duplicated_offsets"] == [{"partition": 1, "offset": 3}]
        assert len(secure_broker.forwarder.authenticated) > before
        assert PASSWORD not in out + err
    finally:
        with connection.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident).as_string(cur.cursor))


def test_a_dead_letter_replay_from_kafka_rereads_through_tls_and_scram(clusters_file, made_pipelines, secure_broker):
    """Replay from Kafka re-reads the dead letters' offsets on the pipeline's own (secure) cluster."""
    from consumers.models import DeadLetter, DeadLetterReplay, Pipeline
    from consumers.operations import dead_letters

    topic = f"secure-dl-{uuid.uuid4().hex[:8]}"
    with kafka_admin.admin_session("secure") as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    producer = clusters.producer("secure", acks="all")
    for value in ("1", "2", "x3", "4", "5?", "6"):
        producer.send(topic, value.encode(), partition=0)
    producer.flush(timeout=30)
    producer.close(timeout=5)
    pipeline = create_pipeline(topic, topic, f"sink_{topic}".replace("-", "_"), cluster="secure", batch_size=10)
    made_pipelines.append(pipeline.sink_table)
    assert run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60).reason == "caught_up"
    assert sorted(DeadLetter.objects.filter(pipeline=pipeline).values_list("offset", flat=True)) == [2, 4]
    DeadLetter.objects.filter(pipeline=pipeline).update(value=b"junk")   # a Kafka replay must not use these
    Pipeline.objects.filter(pk=pipeline.pk).update(transform="tests.replay_transforms.lenient_int")
    pipeline.refresh_from_db()
    before = len(secure_broker.forwarder.authenticated)

    result = dead_letters.replay(pipeline, list(DeadLetter.objects.filter(pipeline=pipeline).values_list(
        "pk", flat=True)), actor="otto", source="kafka")

    assert result.counts == {"replayed": 2}
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 7)}
    assert set(DeadLetterReplay.objects.values_list("source", flat=True)) == {"kafka"}
    assert len(secure_broker.forwarder.authenticated) > before


@pytest.mark.parametrize(("cluster", "mechanism"), [("secure", "SCRAM-SHA-256"), ("scram-512", "SCRAM-SHA-512"),
                                                    ("oauth", "OAUTHBEARER"), ("mtls", None)])
def test_a_librdkafka_pipeline_reads_through_tls_scram_oauthbearer_and_mutual_tls(clusters_file, made_pipelines,
                                                                                  secure_broker, cluster, mechanism,
                                                                                  caplog):
    """The librdkafka client takes the same Cluster through clusters.librdkafka_config: the run authenticates
    with librdkafka's own TLS and SASL (OAUTHBEARER's token from its file), writes each value once, and logs no
    secret."""
    pytest.importorskip("confluent_kafka")
    topic = topic_with_values(cluster)   # the mutual-TLS forwarder fronts a broker of its own
    pipeline = create_pipeline(f"rdk-{topic}", topic, f"sink_rdk_{topic}".replace("-", "_"), cluster=cluster,
                               batch_size=7)
    Pipeline.objects.filter(pk=pipeline.pk).update(kafka_client="librdkafka")
    made_pipelines.append(pipeline.sink_table)
    before = list(secure_broker.forwarder.authenticated)
    result = run_pipeline(pipeline.name, stop_when_caught_up=True, max_seconds=60)
    assert result.reason == "caught_up", result.detail
    assert sink_counts(pipeline.sink_table) == {value: 1 for value in range(1, 41)}
    if mechanism:
        assert ("tally", mechanism) in secure_broker.forwarder.authenticated[len(before):]
    assert PASSWORD not in caplog.text and KEY_PASSWORD not in caplog.text
