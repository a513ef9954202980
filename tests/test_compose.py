"""No Docker engine here: parse docker-compose.yml and check it agrees with the settings."""
import re
import shlex

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


def load_external():
    return yaml.safe_load((ROOT / "docker-compose.external.yml").read_text())


def test_the_external_compose_starts_tally_only_against_your_own_services():
    services = load_external()["services"]
    assert set(services) == {"web", "worker", "tasks", "beat"}
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= {"web"}, name
        env = service["environment"]
        # Your PostgreSQL, Redis and Kafka: required, no default pointing at a bundled service.
        for variable in ("DATABASE_URL", "REDIS_URL", "KAFKA_BOOTSTRAP_SERVERS", "SECRET_KEY"):
            assert re.fullmatch(r"\$\{" + variable + r":\?[^}]+\}", env[variable]), (name, variable)
        # Secrets pass through from the environment when set, and are never written in the file.
        for variable in ("KAFKA_SASL_PASSWORD", "KAFKA_SSL_PASSWORD", "EMAIL_URL"):
            assert variable in env and env[variable] is None, (name, variable)
        assert any(volume.endswith(":/etc/tally/kafka:ro") for volume in service["volumes"]), name


def test_the_external_compose_uses_only_variables_that_settings_read_including_every_kafka_setting():
    read_by_settings = set(re.findall(r'env_\w+\("([A-Z_]+)"', SETTINGS_ENV.read_text()))
    secrets_read_when_a_client_is_built = {"KAFKA_SASL_PASSWORD", "KAFKA_SSL_PASSWORD"}
    kafka_settings = {name for name in read_by_settings if name.startswith("KAFKA_")} | {"TALLY_KAFKA_CLUSTERS"}
    for name, service in load_external()["services"].items():
        env = set(service["environment"])
        assert env <= read_by_settings | secrets_read_when_a_client_is_built, env - read_by_settings
        missing = kafka_settings - env - {"KAFKA_SESSION_TIMEOUT_MS", "KAFKA_REQUEST_TIMEOUT_MS"}
        assert not missing, (name, missing)


def test_web_and_beat_use_the_image_without_java_and_workers_the_spark_one():
    for compose in (load_compose(), load_external()):
        services = compose["services"]
        for name in ("web", "beat"):
            assert services[name]["build"]["args"]["WITH_SPARK"] == "false", name
            assert services[name]["image"] == "tally:web"
        for name in ("worker", "tasks"):   # Spark pipelines; topic checks
            assert services[name]["build"]["args"]["WITH_SPARK"] == "true", name
            assert services[name]["image"] == "tally:spark"
        # The same queues as the bundled stack.
        assert services["worker"]["command"].split()[4:6] == ["-Q", "pipelines"]
        assert services["tasks"]["command"].split()[4:6] == ["-Q", "celery"]


def test_the_dockerfile_installs_java_and_spark_only_with_the_build_argument():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    assert "ARG WITH_SPARK=true" in lines
    argument_at = lines.index("ARG WITH_SPARK=true")
    runs = [line for line in lines if line.startswith("RUN ")]
    java = next(i for i, line in enumerate(lines) if "openjdk" in line)
    # The JRE is installed only inside the RUN that tests the argument, which comes after it.
    java_run = max(i for i, line in enumerate(lines[:java + 1]) if line.startswith("RUN "))
    assert argument_at < java_run and lines[java_run] == 'RUN if [ "$WITH_SPARK" = "true" ]; then \\'
    assert sum("openjdk" in line for line in lines) == 1
    install = next(line for line in runs if "pip install" in line)
    # Both images take the rdkafka extra (one wheel): the web app's doors check a pipeline's chosen client.
    assert install == ('RUN if [ "$WITH_SPARK" = "true" ]; then pip install --no-cache-dir ".[spark,rdkafka]"; '
                       'else pip install --no-cache-dir ".[rdkafka]"; fi')


def test_the_production_worker_reads_with_librdkafka_parks_idle_runs_and_its_image_installs_it():
    # Measured (docs/benchmarks.md "Workers"): with it busy pipelines use every core and idle ones cost little.
    # The worker takes the rest of the shared environment, so it still reaches the same services.
    for compose in (load_compose(), yaml.safe_load((ROOT / "docker-compose.external.yml").read_text())):
        services = compose["services"]
        worker_env, web_env = services["worker"]["environment"], services["web"]["environment"]
        assert "librdkafka" in worker_env["TALLY_KAFKA_CLIENT"]
        assert "10" in str(worker_env["TALLY_PARK_IDLE_SECONDS"])   # its idle runs park
        own = ("TALLY_KAFKA_CLIENT", "TALLY_PARK_IDLE_SECONDS")
        assert {k: v for k, v in worker_env.items() if k not in own} == web_env
    assert 'pip install --no-cache-dir ".[spark,rdkafka]"' in (ROOT / "Dockerfile").read_text()


def test_the_deploy_guides_first_commands_give_the_default_cluster_its_sasl_password(settings, monkeypatch, tmp_path):
    """docs/deploy.md's first block, as written: the variables it exports and the files it writes into ./kafka
    (mounted at /etc/tally/kafka), through the external compose file, make a default cluster whose client gets the
    password. It wrote the password file without naming it, so Tally was refused: 'needs ... a password'."""
    from consumers.kafka import clusters

    block = re.search(r"```sh\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.S).group(1)
    mounted = tmp_path / "kafka"
    mounted.mkdir()
    passed = load_external()["x-tally-env"]
    monkeypatch.delenv("KAFKA_SASL_PASSWORD", raising=False)
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            for name, _, value in (word.partition("=") for word in words[1:]):
                if name.startswith("KAFKA_"):
                    assert name in passed, name
                    setattr(settings, name, value.replace("/etc/tally/kafka/", f"{mounted}/"))
        elif words[:2] == ["echo", "-n"] and words[3] == ">":
            (mounted / words[4].removeprefix("kafka/")).write_text(words[2])
    assert clusters.client_kwargs(None)["sasl_plain_password"] == "the password"
