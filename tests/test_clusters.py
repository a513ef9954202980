"""Cluster settings: the default cluster from the environment, more from a TOML file, validation with clear
errors, and secrets that never appear in a repr, a spec or a message."""
import os
import pickle
import re
import subprocess
import sys

import pytest
from kafka.cluster import collect_hosts

from consumers.kafka import clusters
from consumers.kafka.check import check_cluster
from consumers.kafka.clusters import Cluster, Secret
from consumers.kafka.errors import ClusterConfigError
from tests.pki import make_pki

PASSWORD = "s3cret-Pa55word-that-must-never-show"


@pytest.fixture
def clusters_file(tmp_path, settings):
    path = tmp_path / "clusters.toml"

    def write(text: str):
        path.write_text(text)
        settings.TALLY_KAFKA_CLUSTERS = str(path)
        return path

    return write


def test_the_default_cluster_comes_from_the_kafka_settings(settings, monkeypatch):
    settings.KAFKA_BOOTSTRAP_SERVERS = "b1:9093,b2:9093"
    settings.KAFKA_SECURITY_PROTOCOL = "SASL_SSL"
    settings.KAFKA_SASL_MECHANISM = "SCRAM-SHA-512"
    settings.KAFKA_SASL_USERNAME = "tally"
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", PASSWORD)
    cluster = clusters.get()
    assert cluster.name == "default" and cluster.servers == [("b1", 9093), ("b2", 9093)]
    assert cluster.sasl_password == Secret(env="KAFKA_SASL_PASSWORD")
    assert cluster.mechanism == "SASL SCRAM-SHA-512"
    kwargs = clusters.client_kwargs(cluster)
    assert kwargs["sasl_plain_password"] == PASSWORD and kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["ssl_context"].check_hostname is True


def test_ipv6_bootstrap_servers_reach_the_clients_as_the_addresses_and_ports_written():
    cluster = Cluster(name="v6", bootstrap_servers="[fd00::5]:9092,[::1]:9093,b-3.example:9096")
    assert cluster.servers == [("fd00::5", 9092), ("::1", 9093), ("b-3.example", 9096)]
    # kafka-python's own parsing of what its clients are given, and librdkafka's bracketed form.
    assert [host_port[:2] for host_port in collect_hosts(clusters.client_kwargs(cluster)["bootstrap_servers"],
                                                         randomize=False)] == cluster.servers
    assert clusters.librdkafka_config(cluster)["bootstrap.servers"] == "[fd00::5]:9092,[::1]:9093,b-3.example:9096"


def test_a_password_file_is_read_when_a_client_is_built(settings, tmp_path):
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    settings.KAFKA_SECURITY_PROTOCOL = "SASL_PLAINTEXT"
    settings.KAFKA_SASL_MECHANISM = "PLAIN"
    settings.KAFKA_SASL_USERNAME = "tally"
    settings.KAFKA_SASL_PASSWORD_FILE = str(secret)
    assert clusters.client_kwargs(None)["sasl_plain_password"] == PASSWORD
    secret.write_text("rotated")
    assert clusters.client_kwargs(None)["sasl_plain_password"] == "rotated"


def test_both_a_password_and_a_password_file_are_refused(settings, monkeypatch, tmp_path):
    settings.KAFKA_SASL_PASSWORD_FILE = str(tmp_path / "p")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", PASSWORD)
    with pytest.raises(ClusterConfigError, match="set KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, not both"):
        clusters.get()


def test_an_empty_password_variable_is_unset_as_every_other_empty_kafka_variable(settings, monkeypatch, tmp_path):
    """A deployment's file that lists KAFKA_SSL_PASSWORD= or KAFKA_SASL_PASSWORD= blank sets no password: it was a
    password, so a plain cluster was refused ("an ssl password is set") and a password file "set both"."""
    monkeypatch.setenv("KAFKA_SSL_PASSWORD", "")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "")
    assert clusters.get().ssl_password is None and clusters.get().sasl_password is None
    settings.KAFKA_SECURITY_PROTOCOL = "SASL_PLAINTEXT"
    settings.KAFKA_SASL_MECHANISM = "PLAIN"
    settings.KAFKA_SASL_USERNAME = "tally"
    settings.KAFKA_SASL_PASSWORD_FILE = str(tmp_path / "password")
    (tmp_path / "password").write_text(PASSWORD)
    assert clusters.client_kwargs(None)["sasl_plain_password"] == PASSWORD


def test_a_password_variable_that_is_empty_says_so_when_a_client_is_built(monkeypatch):
    monkeypatch.setenv("EMPTY_PASSWORD", "")
    cluster = Cluster("prod", "b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_username="u", sasl_password=Secret(env="EMPTY_PASSWORD"))
    with pytest.raises(ClusterConfigError, match="the SASL password is read from environment variable "
                                                 "EMPTY_PASSWORD, which is empty"):
        clusters.client_kwargs(cluster)


@pytest.mark.parametrize(("changes", "problem"), [
    ({"security_protocol": "TLS"}, "security_protocol 'TLS' is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"security_protocol": "SASL_SSL"}, "sasl_mechanism '' is not one of PLAIN, SCRAM-SHA-256"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI", "sasl_username": "u"}, "'GSSAPI' is not one of"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}, "PLAIN needs sasl_username and a password"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"}, "OAUTHBEARER needs sasl_oauth_token_file"),
    ({"sasl_mechanism": "PLAIN"}, "SASL settings are set but security_protocol is PLAINTEXT"),
    ({"ssl_cafile": "/ca.pem"}, "TLS files are set but security_protocol is PLAINTEXT"),
    ({"security_protocol": "SSL", "ssl_keyfile": "/k.pem"}, "ssl_keyfile is set without ssl_certfile"),
    ({"bootstrap_servers": "broker"}, "bootstrap_servers must be a comma-separated list of host:port"),
    ({"name": "no spaces"}, "a cluster name is 1-64 letters"),
])
def test_inconsistent_settings_are_refused_with_the_reason(changes, problem):
    values = {"name": "prod", "bootstrap_servers": "b:9092", **changes}
    with pytest.raises(ClusterConfigError) as refused:
        Cluster(**values)
    assert problem in str(refused.value)


def test_clusters_come_from_the_toml_file_with_secrets_by_name_or_file(clusters_file, monkeypatch, tmp_path):
    make_pki(tmp_path)   # writes ca.pem beside the file
    path = clusters_file("""
[clusters.prod]
bootstrap_servers = ["b1:9096", "b2:9096"]
security_protocol = "SASL_SSL"
ssl_cafile = "ca.pem"
sasl_mechanism = "SCRAM-SHA-256"
sasl_username = "tally"
sasl_password_env = "PROD_KAFKA_PASSWORD"

[clusters.aiven]
bootstrap_servers = "kafka.aivencloud.com:12345"
security_protocol = "SSL"
ssl_certfile = "/etc/tally/service.cert"
ssl_keyfile = "/etc/tally/service.key"
ssl_check_hostname = false
""")
    assert clusters.names() == ["default", "aiven", "prod"]
    prod = clusters.get("prod")
    assert prod.bootstrap_servers == "b1:9096,b2:9096"
    assert prod.ssl_cafile == str(tmp_path / "ca.pem")   # relative to the file
    assert prod.sasl_password == Secret(env="PROD_KAFKA_PASSWORD")
    assert prod.source == f"{path} [clusters.prod]"
    assert clusters.get("aiven").ssl_check_hostname is False
    monkeypatch.setenv("PROD_KAFKA_PASSWORD", PASSWORD)
    assert clusters.client_kwargs("prod")["sasl_plain_username"] == "tally"


@pytest.mark.parametrize(("table", "problem"), [
    ('bootstrap_servers = "b:1"\nsasl_password = "hunter2"', "sasl_password cannot be written in the file; name an "
                                                             "environment variable (sasl_password_env) or a file"),
    ('bootstrap_servers = "b:1"\nsecurity_protocl = "SSL"', "unknown keys ['security_protocl']"),
    ('security_protocol = "SSL"', "bootstrap_servers is required"),
    ('bootstrap_servers = "b:1"\nssl_check_hostname = "no"', "ssl_check_hostname must be a boolean"),
])
def test_a_wrong_table_in_the_file_is_refused_naming_the_cluster_and_key(clusters_file, table, problem):
    clusters_file(f"[clusters.prod]\n{table}\n")
    with pytest.raises(ClusterConfigError) as refused:
        clusters.get("prod")
    assert str(refused.value).startswith("Kafka cluster 'prod': ")
    assert problem in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_the_file_cannot_redefine_the_default_cluster(clusters_file):
    clusters_file('[clusters.default]\nbootstrap_servers = "b:1"\n')
    with pytest.raises(ClusterConfigError, match="the default cluster comes from the KAFKA_\\* environment"):
        clusters.names()


def test_an_unknown_cluster_names_the_configured_ones(clusters_file):
    clusters_file('[clusters.prod]\nbootstrap_servers = "b:1"\n')
    with pytest.raises(ClusterConfigError, match="no such cluster \\(configured: default, prod;"):
        clusters.get("staging")


def test_a_file_that_is_not_toml_says_where(clusters_file):
    clusters_file("[clusters.prod\n")
    with pytest.raises(ClusterConfigError, match="is not valid TOML"):
        clusters.names()


def test_a_missing_secret_says_where_it_was_looked_for_not_what_it_is(monkeypatch):
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    cluster = Cluster("prod", "b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                      sasl_username="u", sasl_password=Secret(env="NOT_SET_ANYWHERE"))
    with pytest.raises(ClusterConfigError, match="the SASL password is read from environment variable "
                                                 "NOT_SET_ANYWHERE, which is not set"):
        clusters.client_kwargs(cluster)


def test_the_description_says_where_every_secret_is_read_from(monkeypatch, tmp_path):
    """SASL over mutual TLS with an encrypted key (two secrets), and OAUTHBEARER's token file."""
    monkeypatch.setenv("PROD_PASSWORD", PASSWORD)
    both = Cluster("prod", "b:1", security_protocol="SASL_SSL", ssl_certfile="/pki/client.pem",
                   ssl_password=Secret(file="/run/secrets/key-password"), sasl_mechanism="SCRAM-SHA-512",
                   sasl_username="u", sasl_password=Secret(env="PROD_PASSWORD"))
    assert clusters.describe(both)["password_from"] == (
        "environment variable PROD_PASSWORD (SASL password); file /run/secrets/key-password (client key password)")
    oauth = Cluster("oauth", "b:1", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                    sasl_oauth_token_file="/run/secrets/token")
    assert clusters.describe(oauth)["password_from"] == "file /run/secrets/token (OAUTHBEARER token)"
    assert PASSWORD not in repr(clusters.describe(both))


def test_no_secret_is_in_a_repr_a_spec_or_a_pickle(monkeypatch):
    monkeypatch.setenv("PROD_PASSWORD", PASSWORD)
    cluster = Cluster("prod", "b:1", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256",
                      sasl_username="u", sasl_password=Secret(env="PROD_PASSWORD"))
    assert PASSWORD not in repr(cluster) and PASSWORD not in str(cluster)
    spec = cluster.spec()
    assert PASSWORD not in repr(spec)
    assert Cluster.from_spec(spec) == cluster
    assert PASSWORD.encode() not in pickle.dumps(cluster)
    assert cluster.secret_values() == [PASSWORD]


def test_the_oauthbearer_token_is_read_from_its_file_at_each_authentication(tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    cluster = Cluster("oauth", "b:1", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                      sasl_oauth_token_file=str(token))
    provider = clusters.client_kwargs(cluster)["sasl_oauth_token_provider"]
    assert provider.token() == "first-token"
    token.write_text("second-token")
    assert provider.token() == "second-token"


def test_a_wrong_ca_file_is_a_settings_error_naming_the_file(tmp_path):
    cafile = tmp_path / "ca.pem"
    cafile.write_text("not a certificate")
    cluster = Cluster("prod", "b:1", security_protocol="SSL", ssl_cafile=str(cafile))
    with pytest.raises(ClusterConfigError, match=f"ssl_cafile {cafile} cannot be loaded"):
        clusters.client_kwargs(cluster)


def test_checking_a_good_cluster_in_a_bad_file_names_the_bad_table(clusters_file):
    clusters_file('[clusters.pay]\nbootstrap_servers = "b:1"\n[clusters.bad]\nbootstrap_servers = "nonsense"\n')
    result = check_cluster("pay")
    assert (result.ok, result.step) == (False, "settings")
    assert result.error.startswith("Kafka cluster 'pay': the clusters file is invalid: bootstrap_servers must be")
    assert result.error.endswith("[clusters.bad])")


def test_a_refused_describe_configs_is_an_error_not_a_topic_without_settings():
    """kafka-python drops each resource's error code from a DescribeConfigs reply: the factory's admin client
    raises it, so a topic the principal may not describe does not read as one of the default cleanup.policy."""
    from kafka.errors import TopicAuthorizationFailedError
    from kafka.protocol.admin import DescribeConfigsResponse

    Result = DescribeConfigsResponse.DescribeConfigsResult
    refused = DescribeConfigsResponse(throttle_time_ms=0, results=[Result(
        error_code=29, error_message="Topic authorization failed.", resource_type=2, resource_name="orders",
        configs=[])])
    with pytest.raises(TopicAuthorizationFailedError, match="orders"):
        clusters._AdminClient._describe_configs_process_responses([refused], "all")


def test_an_empty_secret_file_says_so_when_a_client_is_built_as_an_empty_variable_does(tmp_path):
    """A password file a sidecar has not written yet (or `echo > file`) was read as an empty password: the broker
    refused it as 'a wrong user name or password?', or the key could not be unlocked. It names the file."""
    empty = tmp_path / "secret"
    empty.write_text("\n")
    said = re.escape(f"is read from file {empty}, which is empty")
    sasl = Cluster("prod", "b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                   sasl_username="u", sasl_password=Secret(file=str(empty)))
    with pytest.raises(ClusterConfigError, match="the SASL password " + said):
        clusters.client_kwargs(sasl)
    pki = make_pki(tmp_path, client_key_password="the key's password")
    key = Cluster("prod", "b:1", security_protocol="SSL", ssl_certfile=str(pki.client_cert),
                  ssl_keyfile=str(pki.client_key), ssl_password=Secret(file=str(empty)))
    with pytest.raises(ClusterConfigError, match="the ssl password " + said):
        clusters.client_kwargs(key)
    oauth = Cluster("prod", "b:1", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                    sasl_oauth_token_file=str(empty))
    with pytest.raises(ClusterConfigError, match="the OAUTHBEARER token " + said):
        clusters.client_kwargs(oauth)["sasl_oauth_token_provider"].token()


def test_a_secret_file_that_is_not_utf8_is_a_settings_error_quoting_none_of_it(tmp_path):
    """`UnicodeDecodeError` passed every `except ClusterConfigError`: a 500 on the clusters page and the pages of
    the cluster's pipelines, a traceback from `kafka check`, and a run's stored error quoting a byte of the
    password and its position."""
    latin1 = tmp_path / "secret"
    latin1.write_bytes("p\u00e4ssword".encode("latin-1"))
    said = re.escape(f"in file {latin1} is not UTF-8 text")
    sasl = Cluster("prod", "b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                   sasl_username="u", sasl_password=Secret(file=str(latin1)))
    with pytest.raises(ClusterConfigError, match="the SASL password " + said) as refused:
        clusters.client_kwargs(sasl)
    assert "0xe4" not in str(refused.value) and "position" not in str(refused.value)
    assert check_cluster(sasl).ok is False
    oauth = Cluster("prod", "b:1", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                    sasl_oauth_token_file=str(latin1))
    with pytest.raises(ClusterConfigError, match="the OAUTHBEARER token " + said):
        clusters.client_kwargs(oauth)["sasl_oauth_token_provider"].token()
    assert oauth.secret_values() == []


def test_an_encrypted_client_key_without_its_password_is_refused_not_asked_for_on_the_terminal(tmp_path):
    """OpenSSL asks for an encrypted key's pass phrase on the controlling terminal when no password is given:
    `manage.py kafka check` (or a worker in the foreground) printed "Enter PEM pass phrase:" and waited there.
    Run here under a terminal of its own (`script`), it answers at once with what to set."""
    pki = make_pki(tmp_path, client_key_password="the key's password")
    program = ("from consumers.kafka import clusters; from consumers.kafka.errors import ClusterConfigError\n"
               f"c = clusters.Cluster('prod', 'b:1', security_protocol='SSL', ssl_certfile={str(pki.client_cert)!r}, "
               f"ssl_keyfile={str(pki.client_key)!r})\n"
               "try:\n    clusters.client_kwargs(c)\nexcept ClusterConfigError as exc:\n    print('REFUSED', exc)\n")
    script = tmp_path / "load_key.py"
    script.write_text(program)
    command = f"{sys.executable} {script}"
    done = subprocess.run(["script", "-qec", command, "/dev/null"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert "pass phrase" not in done.stdout
    assert "REFUSED" in done.stdout and "an encrypted key: set its ssl password" in done.stdout, done.stdout


def test_a_password_or_token_sent_unencrypted_is_named_by_kafka_check_the_clusters_page_and_its_api(
        transactional_db, clusters_file, monkeypatch, capsys):
    """SASL_PLAINTEXT with PLAIN or OAUTHBEARER puts the password or token on the network in clear; Kafka allows it
    (a private network), so Tally does too, but says so wherever the cluster is shown. SCRAM never sends the
    password, and SASL_SSL encrypts it: no warning."""
    from django.test import Client

    from tests.commands import run_command
    from tests.views_helpers import make_viewer

    monkeypatch.setenv("PLAIN_PASSWORD", PASSWORD)
    table = 'bootstrap_servers = "localhost:1"\nsasl_username = "u"\nsasl_password_env = "PLAIN_PASSWORD"\n'
    clusters_file(f'[clusters.clear]\n{table}security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                  f'[clusters.scram]\n{table}security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "SCRAM-SHA-256"\n'
                  f'[clusters.tls]\n{table}security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"\n')
    warning = "SASL PLAIN over SASL_PLAINTEXT sends the password unencrypted: use SASL_SSL"
    code, out, _ = run_command(capsys, "kafka", "check", "clear")
    assert code == 1 and f"  warning      {warning}\n" in out
    assert "warning" not in run_command(capsys, "kafka", "check", "scram")[1]
    assert run_command(capsys, "kafka", "clusters", "--json")[1].count(warning) == 1
    viewer = Client()
    viewer.force_login(make_viewer())
    assert viewer.get("/clusters/").content.decode().count(warning) == 1
    shown = {c["name"]: c["warning"] for c in viewer.get("/api/clusters/").json()["clusters"]}
    assert shown == {"default": None, "clear": warning, "scram": None, "tls": None}
    oauth = Cluster("oauth", "b:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                    sasl_oauth_token_file="/run/token")
    assert oauth.warning == "SASL OAUTHBEARER over SASL_PLAINTEXT sends the token unencrypted: use SASL_SSL"


def test_the_file_takes_a_protocol_and_mechanism_in_any_case_as_the_environment_does(clusters_file):
    """KAFKA_SECURITY_PROTOCOL=sasl_ssl is SASL_SSL (librdkafka's own spelling); the file refused it."""
    clusters_file('[clusters.prod]\nbootstrap_servers = "b:1"\nsecurity_protocol = "sasl_ssl"\n'
                  'sasl_mechanism = "scram-sha-512"\nsasl_username = "u"\nsasl_password_env = "P"\n')
    prod = clusters.get("prod")
    assert (prod.security_protocol, prod.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")


CHECK_EVERY_CLUSTER = """
import django
django.setup()
from consumers.kafka import clusters
for name in clusters.names():
    clusters.check_settings(name)
print("settings usable:", ", ".join(clusters.names()))
"""


def test_relative_tls_and_password_paths_are_found_by_a_process_started_in_another_directory(tmp_path):
    """The web app, the workers and Spark's executors each run from their own directory: relative paths in the
    clusters file are relative to the file, those of the KAFKA_* variables (and TALLY_KAFKA_CLUSTERS itself)
    to the project directory, whatever directory the process started in."""
    from tests.conftest import ROOT

    config = tmp_path / "kafka"
    pki = make_pki(config / "pki")
    (config / "sasl-password").write_text(PASSWORD)
    (config / "clusters.toml").write_text(f"""
[clusters.prod]
bootstrap_servers = "b1:9096"
security_protocol = "SASL_SSL"
ssl_cafile = "pki/{pki.ca_file.name}"
ssl_certfile = "pki/{pki.client_cert.name}"
ssl_keyfile = "pki/{pki.client_key.name}"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "tally"
sasl_password_file = "sasl-password"
""")

    def from_project(path):
        return os.path.relpath(path, ROOT)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tally.settings", "PYTHONPATH": str(ROOT),
           "TALLY_DEVELOPMENT": "1", "KAFKA_BOOTSTRAP_SERVERS": "b1:9096", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "KAFKA_SSL_CAFILE": from_project(pki.ca_file), "KAFKA_SSL_CERTFILE": from_project(pki.client_cert),
           "KAFKA_SSL_KEYFILE": from_project(pki.client_key), "KAFKA_SASL_MECHANISM": "PLAIN",
           "KAFKA_SASL_USERNAME": "tally", "KAFKA_SASL_PASSWORD_FILE": from_project(config / "sasl-password"),
           "TALLY_KAFKA_CLUSTERS": from_project(config / "clusters.toml")}
    env.pop("KAFKA_SASL_PASSWORD", None)
    done = subprocess.run([sys.executable, "-c", CHECK_EVERY_CLUSTER], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "settings usable: default, prod"


def test_spark_is_asked_for_committed_records_only_by_its_own_kafka_format_too():
    """Spark's own `kafka` format (a PLAINTEXT cluster with its connector on the classpath) reads uncommitted
    records unless told: a Spark pipeline wrote an aborted transaction's records into its sink, and a topic check
    counted them as missing. Every Spark reader takes its cluster's options from here; Tally's own source, which
    always reads committed records, accepts the option."""
    from consumers.engine.spark_source import _Options, cluster_options

    options = cluster_options(Cluster("plain", "b:1"))

    assert options["kafka.isolation.level"] == "read_committed"
    assert _Options({**options, "subscribe": "orders"}).cluster().name == "plain"


def test_the_clusters_page_and_its_api_check_every_cluster_and_write_nothing(transactional_db, clusters_file,
                                                                               capsys):
    """GET never writes: each load of the page recorded every cluster's check, so a crawler or a prefetcher
    reloading it rewrote what `kafka check` and the runs had remembered (the last error and when)."""
    from django.test import Client

    from consumers.models import ClusterStatus
    from tests.commands import run_command
    from tests.views_helpers import make_viewer

    clusters_file('[clusters.down]\nbootstrap_servers = "localhost:1"\n')
    assert run_command(capsys, "kafka", "check", "down")[0] == 1
    remembered = list(ClusterStatus.objects.values())
    viewer = Client()
    viewer.force_login(make_viewer())

    page = viewer.get("/clusters/")
    api = viewer.get("/api/clusters/").json()["clusters"]

    assert page.status_code == 200 and "no broker accepts connections at localhost:1" in page.content.decode()
    down = next(c for c in api if c["name"] == "down")
    assert down["reachable"] is False and down["last_error"] == remembered[0]["last_error"]
    assert list(ClusterStatus.objects.values()) == remembered


def test_a_cluster_name_pipelines_use_that_is_no_longer_configured_is_listed_with_what_uses_it(transactional_db,
                                                                                             clusters_file):
    """The file dropped (or renamed) a cluster: its pipelines were shown nowhere on the Clusters page, which listed
    only configured clusters, so nothing said which pipelines could no longer start."""
    from django.test import Client

    from consumers.models import Pipeline
    from tests.conftest import drop_sink_tables
    from tests.pipelines import create_pipeline
    from tests.views_helpers import make_viewer

    clusters_file('[clusters.kept]\nbootstrap_servers = "localhost:1"\n')
    orphan = create_pipeline("orphaned", "orders", "sink_orphaned", epoch=1)
    kept = create_pipeline("on-kept", "orders", "sink_on_kept", epoch=1)
    try:
        Pipeline.objects.filter(pk=orphan.pk).update(cluster="payments")
        Pipeline.objects.filter(pk=kept.pk).update(cluster="kept")
        viewer = Client()
        viewer.force_login(make_viewer())

        page = viewer.get("/clusters/").content.decode()
        listed = viewer.get("/api/clusters/").json()

        assert listed["not_configured"] == [{"name": "payments", "pipelines": ["orphaned"], "watches": []}]
        assert [c["pipelines"] for c in listed["clusters"] if c["name"] == "kept"] == [["on-kept"]]
        assert 'id="unconfigured-payments"' in page and 'href="/pipelines/orphaned/"' in page
    finally:
        drop_sink_tables(["sink_orphaned", "sink_on_kept"])
