"""Settings from the environment, failing loudly with the variable's name.

Tiny helpers in the spirit of healthchecks' `envbool` / `envint`: a bad value stops start-up with a
message that names the variable, instead of a confusing error much later.
"""
import os
import re
from urllib.parse import urlparse

import environ
from django.core.exceptions import ImproperlyConfigured

SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "KEY")


def redact(name: str, value) -> str:
    """A value fit for an error message: secrets hidden, URLs without their password."""
    if any(word in name.upper() for word in SECRET_WORDS):
        return "<hidden>"
    text = str(value)
    try:
        parsed = urlparse(text)
        if parsed.password:
            netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
            return parsed._replace(netloc=netloc).geturl()
    except ValueError:  # not a URL (an unparseable port, brackets): hide it whole, it may hold a password
        if "@" in text:
            return "<hidden>"
    return text


def _fail(name, value, expected):
    # Never print a secret: the message goes to logs and terminals.
    raise ImproperlyConfigured(f"Environment variable {name}={redact(name, value)!r} is not valid: "
                               f"expected {expected}.")


def env_str(name, default):
    return os.environ.get(name, default)


def env_path(name, base):
    """A file's path; a relative one is taken relative to `base` (the project directory), not to the process's
    working directory, which differs between the web app, the workers and Spark's executors. "" is unset."""
    value = os.environ.get(name, "").strip()
    if not value or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(base, value))


def env_bool(name, default):
    """true/false, 1/0, yes/no, on/off; "" is unset, as for env_choice: an empty KAFKA_SSL_CHECK_HOSTNAME or
    SESSION_COOKIE_SECURE in a deployment's file must not turn a check off."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    _fail(name, value, "a boolean (true/false, 1/0, yes/no, on/off)")


def env_int(name, default, minimum=None):
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        _fail(name, value, "an integer")
    if minimum is not None and number < minimum:
        _fail(name, value, f"an integer >= {minimum}")
    return number


def env_choice(name, default, choices):
    """One of `choices`, compared in upper case (KAFKA_SECURITY_PROTOCOL=sasl_ssl is SASL_SSL); "" is unset."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    if value.strip().upper() not in choices:
        _fail(name, value, f"one of {', '.join(choices)}")
    return value.strip().upper()


def env_rate(name, default):
    """A DRF throttle rate, "N/period" with period s, sec, m, min, h, hour, d or day (DRF reads its first letter).
    DRF parses rates only when a request is throttled: a bad one would be a 500 on every API call, not a start-up
    error."""
    value = os.environ.get(name, default)
    number, slash, period = value.strip().partition("/")
    if not (number.isdigit() and slash and period[:1] in ("s", "m", "h", "d") and "/" not in period):
        _fail(name, value, "a rate such as 60/min (requests per s, min, hour or day)")
    return value.strip()


def env_list(name, default):
    value = os.environ.get(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_url(name, default, schemes):
    """A URL whose scheme is one of `schemes`, e.g. redis://host:6379/0."""
    value = os.environ.get(name, default)
    parsed = urlparse(value)
    if parsed.scheme not in schemes or not (parsed.hostname or parsed.path):
        _fail(name, value, f"a URL with scheme {' or '.join(schemes)}")
    try:
        _ = parsed.port   # parsed lazily: a bad port would surface only in the first client, naming no variable
    except ValueError:
        _fail(name, value, "a URL whose port is a number from 0 to 65535")
    return value


def env_web_url(name, default):
    """An http(s) URL with a host, e.g. https://tally.example.com: links in alerts are made from it."""
    value = env_url(name, default, ("http", "https"))
    if not urlparse(value).hostname:
        _fail(name, value, "an http or https URL with a host name, e.g. https://tally.example.com")
    return value


def env_database(name, default):
    value = os.environ.get(name, default)
    try:
        config = environ.Env.db_url_config(value)
    except Exception as exc:  # django-environ raises several types for bad URLs (their text may quote the URL)
        _fail(name, value, f"a database URL such as postgres://user@host:5432/db ({type(exc).__name__})")
    if config.get("ENGINE") != "django.db.backends.postgresql":
        _fail(name, value, "a PostgreSQL URL (postgres:// or postgresql://)")
    if not config.get("NAME"):
        _fail(name, value, "a database name in the URL path")
    return config


def env_email(name):
    """Django EMAIL_* settings from EMAIL_URL (smtp://user:pass@host:port, smtp+tls://, console://)."""
    value = os.environ.get(name)
    if value is None:
        return {}
    try:
        return environ.Env.email_url_config(value)
    except Exception as exc:
        _fail(name, value, f"an email URL such as smtp://user:password@host:25 ({type(exc).__name__})")


def env_bootstrap_servers(name, default):
    value = os.environ.get(name, default)
    servers = [item.strip() for item in value.split(",") if item.strip()]
    if not servers:
        _fail(name, value, "a comma-separated list of host:port")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            _fail(name, value, "a comma-separated list of host:port")
    return ",".join(servers)


def env_secret(name, default=""):
    """A secret (SECRET_KEY): never echoed, never defaulted outside development (settings decide)."""
    return os.environ.get(name, default).strip()


def env_pair(name):
    """"HEADER,value" -> ("HEADER", "value"), e.g. SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https."""
    value = os.environ.get(name)
    if not value:
        return None
    header, _, expected = value.partition(",")
    if not header.strip() or not expected.strip() or "," in expected:
        _fail(name, value, "two comma-separated parts, e.g. HTTP_X_FORWARDED_PROTO,https")
    return header.strip(), expected.strip()


def env_request_header_pair(name):
    """env_pair whose first part names a request header as Django's request.META does (HTTP_X_FORWARDED_PROTO).
    Written as sent (X-Forwarded-Proto), it would match nothing: behind a proxy every request would look like
    plain HTTP, and the HTTPS redirect would loop."""
    pair = env_pair(name)
    if pair is not None and not re.fullmatch(r"HTTP_[A-Z0-9_]+", pair[0]):
        _fail(name, os.environ[name], "a request header as Django names it, e.g. HTTP_X_FORWARDED_PROTO,https "
                                      "for X-Forwarded-Proto")
    return pair
