"""No Docker engine here: parse docker-compose.yml and check it agrees with the settings."""
import re

import yaml

from tests.conftest import ROOT

SETTINGS_ENV = ROOT / "tally" / "settings.py"


def load_compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_every_service_of_the_stack_with_health_checks():
    services = load_compose()["services"]
    assert {"kafka", "postgres", "redis", "web", "worker", "beat"} <= set(services)
    for name in ("kafka", "postgres", "redis", "web", "worker"):
        assert "healthcheck" in services[name], name
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft


def test_compose_app_services_use_only_variables_that_settings_read():
    services = load_compose()["services"]
    read_by_settings = set(re.findall(r'env_\w+\("([A-Z_]+)"', SETTINGS_ENV.read_text()))
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS", "SPARK_MASTER"} <= set(env)
        assert set(env) <= read_by_settings, set(env) - read_by_settings
        # The app reaches the other services by their compose names.
        assert "@postgres:5432/" in env["DATABASE_URL"]
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert {"postgres", "redis", "kafka"} <= set(services[name]["depends_on"])


def test_compose_volumes_keep_the_data():
    compose = load_compose()
    assert {"kafka-data", "postgres-data"} <= set(compose["volumes"])
