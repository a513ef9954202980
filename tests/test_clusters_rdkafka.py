"""librdkafka's connection settings come from the same Cluster as kafka-python's (consumers/kafka/clusters.py):
the mapping key by key, the OAUTHBEARER token read from its file at each refresh, and no secret in any repr or
in what the engine logs."""
import logging

import pytest

from consumers.kafka import clusters
from consumers.kafka.clusters import Cluster, Secret

PASSWORD = "s3cret-Pa55word-that-must-never-show"
KEY_PASSWORD = "k3y-Pa55word-that-must-never-show"
TOKEN = "eyJ0b2tlbi10aGF0LW11c3QtbmV2ZXItc2hvdyJ9"


def test_plaintext_is_servers_and_protocol_only():
    config = clusters.librdkafka_config(Cluster(name="plain", bootstrap_servers="b1:9092, b2:9093"))
    assert config == {"bootstrap.servers": "b1:9092,b2:9093", "security.protocol": "plaintext"}


def test_tls_with_a_client_certificate_maps_to_librdkafkas_ssl_keys(monkeypatch):
    monkeypatch.setenv("KEY_PW", KEY_PASSWORD)
    cluster = Cluster(name="tls", bootstrap_servers="b:9093", security_protocol="SSL", ssl_cafile="/pki/ca.pem",
                      ssl_certfile="/pki/client.pem", ssl_keyfile="/pki/client.key", ssl_password=Secret(env="KEY_PW"),
                      ssl_check_hostname=False)
    assert clusters.librdkafka_config(cluster) == {
        "bootstrap.servers": "b:9093", "security.protocol": "ssl", "ssl.ca.location": "/pki/ca.pem",
        "ssl.endpoint.identification.algorithm": "none", "ssl.certificate.location": "/pki/client.pem",
        "ssl.key.location": "/pki/client.key", "ssl.key.password": KEY_PASSWORD}


def test_tls_without_a_ca_file_uses_the_systems_cas_and_checks_the_host_name():
    config = clusters.librdkafka_config(Cluster(name="tls", bootstrap_servers="b:9093", security_protocol="SSL"))
    assert config["ssl.ca.location"] == "probe" and config["ssl.endpoint.identification.algorithm"] == "https"
    assert "ssl.certificate.location" not in config and "ssl.key.password" not in config


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_with_a_password_maps_to_mechanisms_username_and_password(mechanism, tmp_path):
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    cluster = Cluster(name="sasl", bootstrap_servers="b:9094", security_protocol="SASL_SSL", ssl_cafile="/ca.pem",
                      sasl_mechanism=mechanism, sasl_username="tally", sasl_password=Secret(file=str(tmp_path / "pw")))
    config = clusters.librdkafka_config(cluster)
    assert {k: config[k] for k in ("security.protocol", "sasl.mechanisms", "sasl.username", "sasl.password",
                                   "ssl.ca.location")} == {
        "security.protocol": "sasl_ssl", "sasl.mechanisms": mechanism, "sasl.username": "tally",
        "sasl.password": PASSWORD, "ssl.ca.location": "/ca.pem"}


def test_oauthbearer_reads_the_token_file_at_each_refresh(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cluster = Cluster(name="oauth", bootstrap_servers="b:9094", security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="OAUTHBEARER", sasl_oauth_token_file=str(token_file))
    config = clusters.librdkafka_config(cluster)
    assert config["sasl.mechanisms"] == "OAUTHBEARER" and "sasl.password" not in config
    token, expiry, principal = config["oauth_cb"]("")
    assert token == TOKEN and principal
    token_file.write_text("rotated-token")   # a sidecar rotates it: the next refresh reads the new one
    assert config["oauth_cb"]("")[0] == "rotated-token"
    assert expiry > 0 and TOKEN not in repr(config["oauth_cb"]) and "rotated-token" not in repr(config["oauth_cb"])


def test_no_secret_in_the_reprs_or_the_engine_consumers_log(monkeypatch, caplog, tmp_path):
    pytest.importorskip("confluent_kafka")
    from consumers.engine.consumer import make_consumer

    monkeypatch.setenv("SASL_PW", PASSWORD)
    cluster = Cluster(name="sasl", bootstrap_servers="127.0.0.1:1", security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="SCRAM-SHA-512", sasl_username="tally", sasl_password=Secret(env="SASL_PW"))
    with caplog.at_level(logging.DEBUG):
        consumer = make_consumer("g", topic="t", client_id="tally-t", reset_policy="earliest", max_poll_records=10,
                                 cluster=cluster, client="librdkafka")
        try:
            consumer.assign([0])
            consumer.seek(0, 0)   # a position of its own: no committed offset to ask the missing broker for
            consumer.poll(timeout_ms=300, max_records=10)   # nothing listens on port 1: errors are logged
        finally:
            consumer.close()
    assert PASSWORD not in repr(cluster) and PASSWORD not in repr(consumer) and PASSWORD not in str(vars(consumer))
    assert PASSWORD not in caplog.text
