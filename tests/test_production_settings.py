"""Production settings with production environments: `check --deploy` passes with the documented variables,
DEBUG is off and SECRET_KEY required outside development, environment errors never print secrets, a bad
variable stops start-up naming it, and gunicorn with DEBUG off serves static files (WhiteNoise).

Start-up itself (manage.py, gunicorn) runs in fresh processes. The settings module's own decisions are read
by executing tally/settings.py in this process under the production environment: the same code a start-up
runs first, without the 1.5 s each fresh Django process costs."""
import http.client
import os
import runpy
import socket
import subprocess
import sys
import time
import urllib.request
from unittest import mock

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.conftest import ROOT
from tests.waiting import patience

SECRET = "a-production-secret-key-" + "x" * 40

# The variables docs/security.md documents for a deployment behind a TLS proxy.
PRODUCTION = {
    "TALLY_DEVELOPMENT": "0", "SECRET_KEY": SECRET, "ALLOWED_HOSTS": "tally.example.com",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https", "SECURE_HSTS_PRELOAD": "true",
}


def environment(**overrides) -> dict[str, str]:
    # A production process: none of the test session's development switches (DJANGO_ALLOW_ASYNC_UNSAFE is
    # set for the browser tests) leak into it.
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEBUG", "SECRET_KEY", "TALLY_DEVELOPMENT", "DJANGO_ALLOW_ASYNC_UNSAFE")
           and not k.startswith(("SECURE_", "SESSION_", "CSRF_"))}
    env.update(PRODUCTION)
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def manage(*args, **overrides) -> subprocess.CompletedProcess:
    # Not through manage.py's default: the production image sets TALLY_DEVELOPMENT=0 explicitly.
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=environment(**overrides),
                          capture_output=True, text=True, timeout=120)


def production_settings(**overrides) -> dict:
    """The names tally/settings.py defines when run under environment(**overrides); its ImproperlyConfigured
    (a start-up refusal) propagates."""
    with mock.patch.dict(os.environ, environment(**overrides), clear=True):
        return runpy.run_path(str(ROOT / "tally" / "settings.py"))


def settings_value(name: str, **overrides) -> str:
    return str(eval(name, {}, production_settings(**overrides)))


def start_up_refusal(**overrides) -> str:
    with pytest.raises(ImproperlyConfigured) as refused:
        production_settings(**overrides)
    return str(refused.value)


def test_check_deploy_passes_with_the_documented_production_variables():
    result = manage("check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_when_debug_is_turned_on_in_production():
    result = manage("check", "--deploy", "--fail-level", "WARNING", DEBUG="true")
    assert result.returncode != 0 and "security.W018" in result.stdout + result.stderr


def test_debug_is_off_unless_asked_for_even_in_development():
    assert settings_value("DEBUG", TALLY_DEVELOPMENT="1", SECRET_KEY=None) == "False"
    assert settings_value("DEBUG") == "False"
    assert settings_value("DEBUG", DEBUG="true") == "True"


def test_an_empty_boolean_is_unset_so_a_check_it_guards_stays_on():
    # A deployment's file with KAFKA_SSL_CHECK_HOSTNAME= (or SESSION_COOKIE_SECURE=) read "" as false: host-name
    # checks and secure cookies went off without anyone asking.
    assert settings_value("KAFKA_SSL_CHECK_HOSTNAME", KAFKA_SSL_CHECK_HOSTNAME="") == "True"
    assert settings_value("SESSION_COOKIE_SECURE", SESSION_COOKIE_SECURE=" ") == "True"
    assert settings_value("KAFKA_SSL_CHECK_HOSTNAME", KAFKA_SSL_CHECK_HOSTNAME="false") == "False"
    assert settings_value("DEBUG", DEBUG="") == "False"


def test_the_developer_stack_turns_debug_on_for_its_processes(monkeypatch):
    from dashboard.management.commands.devstack import developer_environment

    monkeypatch.delenv("DEBUG", raising=False)
    assert developer_environment()["DEBUG"] == "true" and developer_environment()["TALLY_DEVELOPMENT"] == "1"
    monkeypatch.setenv("DEBUG", "false")
    assert developer_environment()["DEBUG"] == "false"


def test_secret_key_is_required_outside_development():
    result = manage("check", SECRET_KEY=None)
    assert result.returncode != 0 and "SECRET_KEY must be set outside development" in result.stderr


def test_environment_errors_never_print_passwords():
    result = manage("check", DATABASE_URL="postgres://tally:s3cr3t-pass@db:notaport/tally")
    assert result.returncode != 0 and "DATABASE_URL" in result.stderr
    assert "s3cr3t-pass" not in result.stdout + result.stderr
    result = manage("check", EMAIL_URL="nosuchscheme://mailer:m41l-pass@smtp:25")
    assert result.returncode != 0 and "EMAIL_URL" in result.stderr and "m41l-pass" not in result.stderr
    result = manage("check", REDIS_URL="http://:r3d1s-pass@redis:6379/0")
    assert result.returncode != 0 and "REDIS_URL='http://:***@redis:6379/0'" in result.stderr
    assert "r3d1s-pass" not in result.stderr


def test_the_production_server_serves_static_files_with_debug_off(tmp_path):
    static_root = tmp_path / "static"
    collected = manage("collectstatic", "--noinput", "-v", "0", STATIC_ROOT=str(static_root))
    assert collected.returncode == 0, collected.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = environment(STATIC_ROOT=str(static_root), ALLOWED_HOSTS="127.0.0.1")
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "tally.wsgi:application",
                               "--bind", f"127.0.0.1:{port}", "--workers", "1"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/static/dashboard.css",
                                         headers={"X-Forwarded-Proto": "https"})
        deadline = time.monotonic() + patience(60)
        while True:
            try:
                with urllib.request.urlopen(request, timeout=patience(5)) as response:
                    body, headers = response.read(), response.headers
                break
            except OSError:  # not listening yet, or a first answer slower than the timeout on a busy machine
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        assert body == (ROOT / "static" / "dashboard.css").read_bytes()
        assert headers["Content-Type"].startswith("text/css")
        # The same server refuses plain HTTP with a redirect to HTTPS and sends HSTS over HTTPS.
        login = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/accounts/login/", headers={"X-Forwarded-Proto": "https"}), timeout=10)
        assert "max-age=31536000" in login.headers["Strict-Transport-Security"]
        assert "Secure" in login.headers.get("Set-Cookie", "Secure")
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        plain.request("GET", "/accounts/login/")
        redirect = plain.getresponse()
        assert redirect.status == 301 and redirect.getheader("Location").startswith("https://")
        plain.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_malformed_api_throttle_rate_stops_start_up_naming_the_variable():
    # DRF parses a rate only when it throttles a request: unchecked, "lots" was a 500 on every API call.
    for name, value in (("API_THROTTLE_ANON", "lots"), ("API_THROTTLE_USER", "600/fortnight"),
                        ("API_THROTTLE_TOKEN", "10/min/x")):
        refusal = start_up_refusal(**{name: value})
        assert f"Environment variable {name}=" in refusal and "expected a rate such as 60/min" in refusal
    assert settings_value("REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']['anon']", API_THROTTLE_ANON="100/hour") == \
        "100/hour"


def test_a_bad_log_level_stops_start_up_naming_the_variable_and_any_case_is_a_level():
    assert "Environment variable TALLY_LOG_LEVEL='LOUD' is not valid" in start_up_refusal(TALLY_LOG_LEVEL="LOUD")
    assert manage("check", TALLY_LOG_LEVEL="debug").returncode == 0  # logging's own configuration takes it


def compose_web_healthcheck(compose_file: str, port: int) -> list[str]:
    """The web service's health check command as the compose file gives it, pointed at `port`."""
    import yaml

    test = yaml.safe_load((ROOT / compose_file).read_text())["services"]["web"]["healthcheck"]["test"]
    argv = ["sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
    return [arg.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for arg in argv]


def test_the_web_health_check_passes_when_allowed_hosts_names_only_the_deployments_own_host():
    # docs/deploy.md: ALLOWED_HOSTS is the host names Tally is served under; the check must use one of them.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = environment(ALLOWED_HOSTS="tally.example.com,.tally.internal")
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "gunicorn"), "tally.wsgi:application",
                               "--bind", f"127.0.0.1:{port}", "--workers", "1"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + patience(60)
        while True:   # wait until gunicorn listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.2)
        # Gunicorn listens before its worker has loaded Django: the check's own 5 s would then measure this
        # machine's load, not the check. One answered request first, as the compose retries allow for.
        warm_up = urllib.request.Request(f"http://127.0.0.1:{port}/accounts/login/",
                                         headers={"Host": "tally.example.com", "X-Forwarded-Proto": "https"})
        with urllib.request.urlopen(warm_up, timeout=patience(60)) as answer:
            assert answer.status == 200
        for compose_file in ("docker-compose.yml", "docker-compose.external.yml"):
            argv = compose_web_healthcheck(compose_file, port)
            env_in_container = dict(env, PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
            check = subprocess.run(argv, cwd=ROOT, env=env_in_container, capture_output=True, text=True,
                                   timeout=patience(30))
            assert check.returncode == 0, (compose_file, check.stderr[-500:])
        # A ".tally.internal" pattern first: the check asks for tally.internal, which the pattern matches.
        check = subprocess.run([sys.executable, "-m", "tally.healthcheck", f"http://127.0.0.1:{port}/accounts/login/"],
                               cwd=ROOT, env=dict(env, ALLOWED_HOSTS=".tally.internal"), capture_output=True,
                               text=True, timeout=patience(30))
        assert check.returncode == 0, check.stderr[-500:]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_redis_url_with_a_bad_port_stops_start_up_naming_the_variable_without_its_password():
    # Unchecked, every Celery client failed later ("Port could not be cast to integer"), and a start was
    # recorded as "the task broker is unreachable", which no waiting could fix.
    for port in ("notaport", "99999"):
        refusal = start_up_refusal(REDIS_URL=f"redis://:r3d1s-pass@redis:{port}/0")
        assert f"REDIS_URL='redis://:***@redis:{port}/0' is not valid" in refusal
        assert "r3d1s-pass" not in refusal


def test_an_empty_allowed_hosts_stops_start_up_instead_of_refusing_every_request():
    assert "Environment variable ALLOWED_HOSTS is empty" in start_up_refusal(ALLOWED_HOSTS=" , ")
    assert settings_value("ALLOWED_HOSTS", ALLOWED_HOSTS="", DEBUG="true") == "[]"   # Django's own localhost rule


def test_a_proxy_header_written_as_sent_instead_of_as_django_names_it_stops_start_up():
    # Behind the TLS proxy, X-Forwarded-Proto,https matched no header: every request looked like plain HTTP and
    # the HTTPS redirect looped.
    for value in ("X-Forwarded-Proto,https", "HTTP_X_FORWARDED_PROTO,https,http"):
        assert f"Environment variable SECURE_PROXY_SSL_HEADER={value!r} is not valid" in start_up_refusal(
            SECURE_PROXY_SSL_HEADER=value)
    assert settings_value("SECURE_PROXY_SSL_HEADER") == "('HTTP_X_FORWARDED_PROTO', 'https')"


def test_a_base_url_that_is_not_a_web_address_stops_start_up_naming_the_variable():
    # Accepted before, it made every link in every alert (email, Slack, PagerDuty) point nowhere.
    for value in ("notaurl", "tally.example.com", "ftp://tally.example.com", "https:///alerts"):
        assert f"TALLY_BASE_URL='{value}' is not valid" in start_up_refusal(TALLY_BASE_URL=value)
    assert settings_value("TALLY_BASE_URL", TALLY_BASE_URL="https://tally.example.com/") == \
        "https://tally.example.com/"
