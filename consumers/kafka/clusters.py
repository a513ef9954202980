"""Kafka clusters: their connection settings, and the one factory that builds every Kafka client Tally makes.

    from consumers.kafka import clusters

    cluster = clusters.get("prod")        # a Cluster; clusters.get() or get(None) is "default"
    clusters.consumer(cluster, group_id=None, ...)   # kafka-python KafkaConsumer, connection settings applied
    clusters.admin(cluster)                          # KafkaAdminClient (tolerant of the embedded broker)
    with clusters.shared_admin(cluster) as client:   # the process's one admin client of the cluster, reused
    clusters.producer(cluster, acks="all")           # KafkaProducer
    clusters.client_kwargs(cluster)                  # only the connection keywords, for kafka-python
    clusters.rdkafka_consumer(cluster, config)       # confluent-kafka Consumer (the rdkafka extra)
    clusters.librdkafka_config(cluster)              # only the connection keys, for librdkafka
    clusters.preflight(cluster)                      # resolve, TLS, authenticate, metadata within seconds, or
                                                     # raise ClusterUnavailable naming the cluster, step and cause
    clusters.names() / clusters.all_clusters()       # "default" first, then the file's, by name

Every factory function takes a `Cluster`, a cluster name, or None (the default cluster); keyword arguments
are kafka-python's and override nothing of the connection settings.

Where the settings come from:
- "default": the environment, named as kafka-python and librdkafka users expect (tally/settings.py):
  KAFKA_BOOTSTRAP_SERVERS, KAFKA_SECURITY_PROTOCOL, KAFKA_SSL_CAFILE|CERTFILE|KEYFILE, KAFKA_SSL_PASSWORD
  (or _FILE), KAFKA_SSL_CHECK_HOSTNAME, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD (or
  _FILE), KAFKA_SASL_OAUTH_TOKEN_FILE. Their relative paths are made absolute there, relative to the project
  directory (every process, Spark's executors included, starts in its own working directory).
- more clusters: the TOML file TALLY_KAFKA_CLUSTERS names, one `[clusters.NAME]` table each, with the same
  keys in lower case without `kafka_` (`bootstrap_servers`, `security_protocol`, `sasl_mechanism`, ...).
  Secrets are given by environment-variable name (`sasl_password_env`, `ssl_password_env`) or by file
  (`sasl_password_file`, `ssl_password_file`, `sasl_oauth_token_file`), never as values, so the file can be
  committed. Relative paths are relative to the file's folder.

A `Cluster` holds where its secrets are (`Secret`), never their values: its repr, `spec()` (the plain values
Spark executors receive) and every message are free of secrets. Values are read only when a client is built.
"""
import contextlib
import logging
import os
import re
import ssl
import threading
import time
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from django.conf import settings
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import errors as kafka_errors
from kafka.net.sasl.oauth import AbstractTokenProvider

from consumers.kafka.errors import ClusterConfigError

log = logging.getLogger("tally.kafka")

DEFAULT = "default"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
# Keys of a [clusters.NAME] table; a secret's value is refused with a pointer to its _env/_file keys.
FILE_KEYS = {"bootstrap_servers", "security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile",
             "ssl_password_env", "ssl_password_file", "ssl_check_hostname", "sasl_mechanism", "sasl_username",
             "sasl_password_env", "sasl_password_file", "sasl_oauth_token_file"}
PATH_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password_file", "sasl_password_file",
             "sasl_oauth_token_file")


@dataclass(frozen=True)
class Secret:
    """Where a secret is: an environment variable's name or a file's path. Never its value."""

    env: str = ""
    file: str = ""

    def __str__(self) -> str:
        return f"environment variable {self.env}" if self.env else f"file {self.file}"

    def reveal(self, cluster: str, what: str) -> str:
        """The value, read now (files are re-read: rotated passwords and tokens are picked up)."""
        if self.env:
            value = os.environ.get(self.env)
            if not value:   # an empty password is a blank line in a deployment's file, never a password
                raise ClusterConfigError(cluster, f"{what} is read from {self}, which is "
                                                  f"{'not set' if value is None else 'empty'}")
            return value
        try:
            value = read_secret_file(self.file)
        except OSError as exc:
            raise ClusterConfigError(cluster, f"{what} cannot be read from {self}: {exc.strerror}") from None
        except UnicodeDecodeError:   # its reason would quote a byte of the secret and its position
            raise ClusterConfigError(cluster, f"{what} in {self} is not UTF-8 text") from None
        if not value:   # a file not written yet (a sidecar's), or `echo > file`: the broker would only say "refused"
            raise ClusterConfigError(cluster, f"{what} is read from {self}, which is empty")
        return value


@dataclass(frozen=True)
class Cluster:
    name: str
    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_password: Secret | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: Secret | None = None
    sasl_oauth_token_file: str = ""
    source: str = field(default="its settings", compare=False)   # for messages: where it was defined

    def __post_init__(self):
        problem = self._problem()
        if problem:
            raise ClusterConfigError(self.name, f"{problem} (in {self.source})")

    def _problem(self) -> str:
        if not NAME_PATTERN.fullmatch(self.name):
            return "a cluster name is 1-64 letters, digits, '.', '_' or '-'"
        if not parse_servers(self.bootstrap_servers):
            return "bootstrap_servers must be a comma-separated list of host:port"
        if self.security_protocol not in PROTOCOLS:
            return f"security_protocol {self.security_protocol!r} is not one of {', '.join(PROTOCOLS)}"
        if not self.uses_tls and (self.ssl_cafile or self.ssl_certfile or self.ssl_keyfile):
            return f"TLS files are set but security_protocol is {self.security_protocol} (use SSL or SASL_SSL)"
        if self.ssl_keyfile and not self.ssl_certfile:
            return "ssl_keyfile is set without ssl_certfile"
        if self.ssl_password and not self.ssl_certfile:
            return "an ssl password is set without ssl_certfile (it unlocks the client key)"
        if not self.uses_sasl:
            if self.sasl_mechanism or self.sasl_username or self.sasl_password or self.sasl_oauth_token_file:
                return (f"SASL settings are set but security_protocol is {self.security_protocol} "
                        "(use SASL_PLAINTEXT or SASL_SSL)")
            return ""
        if self.sasl_mechanism not in MECHANISMS:
            return (f"sasl_mechanism {self.sasl_mechanism!r} is not one of {', '.join(MECHANISMS)} "
                    f"(security_protocol {self.security_protocol} needs one)")
        if self.sasl_mechanism == "OAUTHBEARER":
            if not self.sasl_oauth_token_file:
                return "OAUTHBEARER needs sasl_oauth_token_file (a file holding the token)"
        elif not self.sasl_username or self.sasl_password is None:
            return f"{self.sasl_mechanism} needs sasl_username and a password (by environment variable or file)"
        return ""

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def mechanism(self) -> str:
        """What authenticates the client, for pages and `kafka check`."""
        if self.uses_sasl:
            return f"SASL {self.sasl_mechanism}"
        return "TLS client certificate" if self.ssl_certfile else "none"

    @property
    def warning(self) -> str:
        """What the settings allow but a person must know: Kafka accepts PLAIN and OAUTHBEARER over SASL_PLAINTEXT
        (a private network), which puts the password or token on the network in clear. SCRAM never sends it."""
        if self.security_protocol == "SASL_PLAINTEXT" and self.sasl_mechanism in ("PLAIN", "OAUTHBEARER"):
            secret = "password" if self.sasl_mechanism == "PLAIN" else "token"
            return f"SASL {self.sasl_mechanism} over SASL_PLAINTEXT sends the {secret} unencrypted: use SASL_SSL"
        return ""

    @property
    def servers(self) -> list[tuple[str, int]]:
        return parse_servers(self.bootstrap_servers)

    def spec(self) -> dict:
        """Plain values with no secret (secrets stay references), for processes that build their own
        clients: Spark executors. `Cluster.from_spec(spec)` is the same cluster."""
        values = asdict(self)
        for key in ("ssl_password", "sasl_password"):
            values[key] = asdict(getattr(self, key)) if getattr(self, key) else None
        return values

    @classmethod
    def from_spec(cls, spec: dict) -> "Cluster":
        values = dict(spec)
        for key in ("ssl_password", "sasl_password"):
            values[key] = Secret(**values[key]) if values.get(key) else None
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    def secret_values(self) -> list[str]:
        """The secrets' values as they are now, to scrub them from any text that leaves Tally."""
        found = []
        for secret in (self.ssl_password, self.sasl_password):
            if secret is not None:
                try:
                    found.append(secret.reveal(self.name, "secret"))
                except ClusterConfigError:
                    pass
        if self.sasl_oauth_token_file:
            try:
                found.append(read_secret_file(self.sasl_oauth_token_file))
            except (OSError, UnicodeDecodeError):
                pass
        return [value for value in found if len(value) >= 3]


def parse_servers(text) -> list[tuple[str, int]]:
    """"a:9092,b:9093" (or a list of such) -> [("a", 9092), ("b", 9093)]; [] when any entry is malformed."""
    items = text if isinstance(text, list | tuple) else str(text or "").split(",")
    servers = []
    for item in (str(i).strip() for i in items):
        host, _, port = item.rpartition(":")
        if not item or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return []
        servers.append((host.strip("[]"), int(port)))
    return servers


def address(host: str, port: int) -> str:
    """host:port as Kafka clients read it: an IPv6 address in brackets ("[fd00::5]:9092"), or kafka-python takes
    "fd00::5:9092" for an address on its default port."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- where clusters come from --------------------------------------------------------------------------

def default_cluster() -> Cluster:
    """The "default" cluster, from the environment (read into Django settings at start-up)."""
    def env_secret(name: str) -> Secret | None:
        # Empty is unset, as for every other KAFKA_* variable: a blank line in a deployment's file sets nothing.
        value_file, given = getattr(settings, f"{name}_FILE", ""), bool(os.environ.get(name))
        if given and value_file:
            raise ClusterConfigError(DEFAULT, f"set {name} or {name}_FILE, not both")
        if value_file:
            return Secret(file=value_file)
        return Secret(env=name) if given else None

    return Cluster(
        name=DEFAULT, bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
        security_protocol=getattr(settings, "KAFKA_SECURITY_PROTOCOL", "PLAINTEXT"),
        ssl_cafile=getattr(settings, "KAFKA_SSL_CAFILE", ""),
        ssl_certfile=getattr(settings, "KAFKA_SSL_CERTFILE", ""),
        ssl_keyfile=getattr(settings, "KAFKA_SSL_KEYFILE", ""),
        ssl_password=env_secret("KAFKA_SSL_PASSWORD"),
        ssl_check_hostname=getattr(settings, "KAFKA_SSL_CHECK_HOSTNAME", True),
        sasl_mechanism=getattr(settings, "KAFKA_SASL_MECHANISM", ""),
        sasl_username=getattr(settings, "KAFKA_SASL_USERNAME", ""),
        sasl_password=env_secret("KAFKA_SASL_PASSWORD"),
        sasl_oauth_token_file=getattr(settings, "KAFKA_SASL_OAUTH_TOKEN_FILE", ""))


_file_cache: dict = {}


def file_clusters() -> dict[str, Cluster]:
    """The clusters of the TALLY_KAFKA_CLUSTERS file ({} when unset); read again when the file changes."""
    path = getattr(settings, "TALLY_KAFKA_CLUSTERS", "")
    if not path:
        return {}
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise ClusterConfigError("*", f"TALLY_KAFKA_CLUSTERS names {path}, which cannot be read: "
                                      f"{exc.strerror}") from None
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _file_cache:
        _file_cache.clear()
        _file_cache[key] = _parse_file(Path(path))
        _close_removed(set(_file_cache[key]))
    return _file_cache[key]


def _parse_file(path: Path) -> dict[str, Cluster]:
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterConfigError("*", f"{path} cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:   # names a line and column, never echoes a value
        raise ClusterConfigError("*", f"{path} is not valid TOML: {exc}") from None
    except RecursionError:   # tomllib's parser recurses per nested array or inline table
        raise ClusterConfigError("*", f"{path} is not valid TOML: it nests too deeply") from None
    unknown_top = set(document) - {"clusters"}
    if unknown_top or not isinstance(document.get("clusters", {}), dict):
        raise ClusterConfigError("*", f"{path} holds only [clusters.NAME] tables (found {sorted(unknown_top)})")
    found = {}
    for name, table in document.get("clusters", {}).items():
        found[name] = _cluster_from_table(path, name, table)
    return found


def _cluster_from_table(path: Path, name: str, table) -> Cluster:
    where = f"{path} [clusters.{name}]"
    if name == DEFAULT:
        raise ClusterConfigError(name, f"{where}: the default cluster comes from the KAFKA_* environment "
                                       "variables; give this one another name")
    if not isinstance(table, dict):
        raise ClusterConfigError(name, f"{where} must be a table")
    for key in ("sasl_password", "ssl_password"):
        if key in table:   # never echo its value
            raise ClusterConfigError(name, f"{where}: {key} cannot be written in the file; name an environment "
                                           f"variable ({key}_env) or a file ({key}_file)")
    unknown = sorted(set(table) - FILE_KEYS)
    if unknown:
        raise ClusterConfigError(name, f"{where}: unknown keys {unknown} (known: {sorted(FILE_KEYS)})")
    values = {}
    for key, value in table.items():
        expected = bool if key == "ssl_check_hostname" else (str, list) if key == "bootstrap_servers" else str
        if not isinstance(value, expected):
            raise ClusterConfigError(name, f"{where}: {key} must be a "
                                           f"{'boolean' if expected is bool else 'string'}")
        if key in PATH_KEYS and value:
            value = str((path.parent / value).resolve()) if not os.path.isabs(value) else value
        if key in ("security_protocol", "sasl_mechanism"):   # as KAFKA_* (tally/env.py): sasl_ssl is SASL_SSL
            value = value.strip().upper()
        values[key] = value
    if isinstance(values.get("bootstrap_servers"), list):
        values["bootstrap_servers"] = ",".join(str(s) for s in values["bootstrap_servers"])
    secrets = {}
    for key in ("sasl_password", "ssl_password"):
        env, file = values.pop(f"{key}_env", ""), values.pop(f"{key}_file", "")
        if env and file:
            raise ClusterConfigError(name, f"{where}: set {key}_env or {key}_file, not both")
        secrets[key] = Secret(env=env) if env else Secret(file=file) if file else None
    if "bootstrap_servers" not in values:
        raise ClusterConfigError(name, f"{where}: bootstrap_servers is required")
    return Cluster(name=name, source=where, **values, **secrets)


def all_clusters() -> list[Cluster]:
    """Every configured cluster: "default" first, then the file's by name."""
    return [default_cluster()] + [c for _, c in sorted(file_clusters().items())]


def names() -> list[str]:
    return [DEFAULT] + sorted(file_clusters())


def names_or_default() -> list[str]:
    """names(), or only "default" while the clusters file cannot be read: the default cluster needs no file, so a
    page or a pass that lists clusters goes on with it (the pages that list clusters say why)."""
    try:
        return names()
    except ClusterConfigError:
        return [DEFAULT]


def get(cluster: "Cluster | str | None" = None) -> Cluster:
    """A cluster by name (None or "" is the default); a Cluster is returned as it is."""
    if isinstance(cluster, Cluster):
        return cluster
    if not cluster or cluster == DEFAULT:
        return default_cluster()
    found = file_clusters().get(cluster)
    if found is None:
        configured = ", ".join(names())
        raise ClusterConfigError(cluster, f"no such cluster (configured: {configured}; more clusters come "
                                          "from the file TALLY_KAFKA_CLUSTERS names)")
    return found


def describe(cluster: Cluster) -> dict:
    """A cluster for people: settings, and where each secret comes from, never its value."""
    return {"name": cluster.name, "bootstrap_servers": cluster.bootstrap_servers,
            "security_protocol": cluster.security_protocol, "mechanism": cluster.mechanism,
            "ssl_cafile": cluster.ssl_cafile or None, "ssl_certfile": cluster.ssl_certfile or None,
            "ssl_check_hostname": cluster.ssl_check_hostname, "sasl_username": cluster.sasl_username or None,
            "password_from": secrets_from(cluster), "warning": cluster.warning or None, "source": cluster.source}


def secrets_from(cluster: Cluster) -> str | None:
    """Where each of the cluster's secrets is read from (the SASL password or token, the client key's password),
    never a value."""
    sources = [f"{secret} ({what})" for what, secret in (
        ("SASL password", cluster.sasl_password),
        ("OAUTHBEARER token", cluster.sasl_oauth_token_file and Secret(file=cluster.sasl_oauth_token_file)),
        ("client key password", cluster.ssl_password)) if secret]
    return "; ".join(sources) or None


# --- the one factory -------------------------------------------------------------------------------------

class FileTokenProvider(AbstractTokenProvider):
    """OAUTHBEARER: the token is read from a file at each authentication, so a sidecar can rotate it."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def token(self) -> str:
        return Secret(file=self.cluster.sasl_oauth_token_file).reveal(self.cluster.name, "the OAUTHBEARER token")


def ssl_context(cluster: Cluster) -> ssl.SSLContext:
    """The TLS context of every connection to the cluster (kafka-python's own defaults: TLS 1.2 or later,
    the CA file or the system's CAs, the host name checked unless ssl_check_hostname is false)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = cluster.ssl_check_hostname
    try:
        if cluster.ssl_cafile:
            context.load_verify_locations(cluster.ssl_cafile)
        else:
            context.load_default_certs()
    except (OSError, ssl.SSLError) as exc:
        raise ClusterConfigError(cluster.name, f"ssl_cafile {cluster.ssl_cafile} cannot be loaded: "
                                               f"{_os_reason(exc)}") from None
    if cluster.ssl_certfile:
        # Without a password OpenSSL would ask for an encrypted key's pass phrase on the terminal, and wait there:
        # an empty one fails the load instead.
        password = (cluster.ssl_password.reveal(cluster.name, "the ssl password") if cluster.ssl_password
                    else _no_pass_phrase)
        try:
            context.load_cert_chain(cluster.ssl_certfile, cluster.ssl_keyfile or None, password=password)
        except (OSError, ssl.SSLError, ValueError) as exc:   # ValueError: a password over OpenSSL's 1,023 bytes
            hint = "a wrong ssl password?" if cluster.ssl_password else "an encrypted key: set its ssl password"
            raise ClusterConfigError(cluster.name, f"the client certificate ({cluster.ssl_certfile}) or its key "
                                                   f"cannot be loaded: {_os_reason(exc)} ({hint})") from None
    return context


def _no_pass_phrase() -> bytes:
    return b""


def read_secret_file(path: str) -> str:
    """A secret file's text, stripped (a trailing newline is the editor's, never the secret's)."""
    return Path(path).read_text(encoding="utf-8").strip()


def _os_reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or type(exc).__name__


def client_kwargs(cluster: "Cluster | str | None" = None) -> dict:
    """kafka-python's connection keywords for the cluster. They hold secrets: never log or show them."""
    cluster = get(cluster)
    kwargs = {"bootstrap_servers": [address(host, port) for host, port in cluster.servers],
              "security_protocol": cluster.security_protocol}
    if cluster.uses_tls:
        kwargs["ssl_context"] = ssl_context(cluster)
        kwargs["ssl_check_hostname"] = cluster.ssl_check_hostname
    kwargs.update(_sasl_settings(cluster, ("sasl_mechanism", "sasl_oauth_token_provider", "sasl_plain_username",
                                           "sasl_plain_password"), FileTokenProvider))
    return kwargs


def check_settings(cluster: "Cluster | str | None" = None) -> Cluster:
    """Read what building a client reads, without connecting: the cluster configured, its secrets (environment or
    file) and TLS files usable, and an OAUTHBEARER token file. Raises ClusterConfigError naming the cluster, as the
    build (or authentication) would: doors that refuse before anything moves ask this instead of waiting for it."""
    cluster = get(cluster)
    client_kwargs(cluster)
    if cluster.uses_sasl and cluster.sasl_mechanism == "OAUTHBEARER":
        FileTokenProvider(cluster).token()   # read at each authentication, not at the build
    return cluster


def _sasl_settings(cluster: Cluster, names: tuple[str, str, str, str], token_source) -> dict:
    """The cluster's SASL settings under one client's names for (mechanism, token source, username, password):
    OAUTHBEARER takes a token source made for the cluster, every other mechanism a username and password."""
    if not cluster.uses_sasl:
        return {}
    mechanism, token, username, password = names
    if cluster.sasl_mechanism == "OAUTHBEARER":
        return {mechanism: cluster.sasl_mechanism, token: token_source(cluster)}
    return {mechanism: cluster.sasl_mechanism, username: cluster.sasl_username,
            password: cluster.sasl_password.reveal(cluster.name, "the SASL password")}


class _AdminClient(KafkaAdminClient):
    """kafka-python's admin client, tolerant of a DescribeGroups reply whose authorized-operations bit
    set has values it does not know (the embedded broker sends them even when not asked)."""

    def _process_acl_operations(self, obj):
        try:
            return super()._process_acl_operations(obj)
        except ValueError:
            obj["authorized_operations"] = None
            return obj

    @classmethod
    def _describe_configs_process_responses(cls, responses, config_filter="modified"):
        # kafka-python drops each resource's error code: a refusal (TopicAuthorizationFailed) would read as a
        # resource without settings, e.g. a topic of the default cleanup.policy.
        for response in responses:
            for result in response.results:
                error = kafka_errors.for_code(result.error_code)
                if error is not kafka_errors.NoError:
                    raise error(f"{result.resource_name}: {result.error_message}")
        return super()._describe_configs_process_responses(responses, config_filter)


def _request_timeout_ms() -> int:
    # Spark's Python workers build clients without Django settings: kafka-python's own default there.
    return settings.KAFKA_REQUEST_TIMEOUT_MS if settings.configured else 30000


def _config(cluster, defaults: dict, overrides: dict) -> dict:
    # A client that cannot bootstrap (Kafka went down since the cluster's check passed) gives up after the
    # request timeout too, not after kafka-python's own 30 s.
    timeout_ms = _request_timeout_ms()
    config = {"request_timeout_ms": timeout_ms, "bootstrap_timeout_ms": timeout_ms, **defaults, **overrides}
    config.update(client_kwargs(cluster))
    return config


def consumer(cluster: "Cluster | str | None" = None, **kwargs) -> KafkaConsumer:
    return KafkaConsumer(**_config(cluster, {"client_id": "tally"}, kwargs))


def admin(cluster: "Cluster | str | None" = None, **kwargs) -> KafkaAdminClient:
    return _AdminClient(**_config(cluster, {"client_id": "tally-admin"}, kwargs))


def producer(cluster: "Cluster | str | None" = None, **kwargs) -> KafkaProducer:
    return KafkaProducer(**_config(cluster, {"client_id": "tally-producer"}, kwargs))


# --- librdkafka (confluent-kafka, the optional extra `tally[rdkafka]`) -----------------------------------

def librdkafka_config(cluster: "Cluster | str | None" = None) -> dict:
    """librdkafka's connection keys for the cluster, the same settings as `client_kwargs`. They hold
    secrets: never log or show them. OAUTHBEARER reads the token file at each refresh (`oauth_cb`)."""
    cluster = get(cluster)
    config = {"bootstrap.servers": ",".join(address(host, port) for host, port in cluster.servers),
              "security.protocol": cluster.security_protocol.lower()}
    if cluster.uses_tls:
        # "probe": the system's CAs, as kafka-python's load_default_certs() (the wheel's OpenSSL has none).
        config["ssl.ca.location"] = cluster.ssl_cafile or "probe"
        config["ssl.endpoint.identification.algorithm"] = "https" if cluster.ssl_check_hostname else "none"
        if cluster.ssl_certfile:
            config["ssl.certificate.location"] = cluster.ssl_certfile
            config["ssl.key.location"] = cluster.ssl_keyfile or cluster.ssl_certfile
            if cluster.ssl_password:
                config["ssl.key.password"] = cluster.ssl_password.reveal(cluster.name, "the ssl password")
    config.update(_sasl_settings(cluster, ("sasl.mechanisms", "oauth_cb", "sasl.username", "sasl.password"),
                                 OAuthTokenCallback))
    return config


class OAuthTokenCallback:
    """librdkafka's oauth_cb: the token read from the cluster's file at each refresh (a sidecar rotates it).
    The token's lifetime is not known from the file, so librdkafka is told TOKEN_REFRESH_S and refreshes at 80 %
    of it; its repr names the file, never the token."""

    TOKEN_REFRESH_S = 60

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def __repr__(self):
        return f"<OAuthTokenCallback {self.cluster.name}: token from file {self.cluster.sasl_oauth_token_file}>"

    def __call__(self, _oauthbearer_config):
        token = FileTokenProvider(self.cluster).token()
        # librdkafka wants a principal name; the broker takes the principal from the token.
        return token, time.time() + self.TOKEN_REFRESH_S, "tally"


def rdkafka_consumer(cluster: "Cluster | str | None", config: dict):
    """A confluent-kafka Consumer with the cluster's connection settings; `config` holds librdkafka's other
    keys and overrides none of the connection's."""
    from confluent_kafka import Consumer

    return Consumer({"socket.timeout.ms": _request_timeout_ms(), **config, **librdkafka_config(cluster)})


# --- fast, clear failures -------------------------------------------------------------------------------

# A passing check is trusted this long per process, so a page that makes many admin calls checks once.
PREFLIGHT_TTL_S = 15.0
_passed: dict = {}


def preflight(cluster: "Cluster | str | None" = None, timeout_s: float | None = None) -> Cluster:
    """Check within seconds that the cluster can be used (the steps of `kafka check`) before a client that
    would retry for the whole request timeout is built. Raises ClusterConfigError or ClusterUnavailable,
    whose message names the cluster, the step and the cause; returns the cluster."""
    from consumers.kafka.check import CHECK_TIMEOUT_S, check_cluster

    cluster = get(cluster)
    key = repr(cluster)
    if time.monotonic() - _passed.get(key, -PREFLIGHT_TTL_S) < PREFLIGHT_TTL_S:
        return cluster
    result = check_cluster(cluster, timeout_s=timeout_s or CHECK_TIMEOUT_S, read_metadata=False)
    result.raise_for_failure()
    _passed[key] = time.monotonic()
    return cluster


# --- one admin client per cluster and process ------------------------------------------------------------

# {(pid, cluster name, cluster): (lock, [client or None])}. Keyed by process id: a forked worker builds its own
# client instead of sharing its parent's sockets.
_shared: dict = {}
_shared_guard = threading.Lock()


@contextlib.contextmanager
def shared_admin(cluster: "Cluster | str | None" = None):
    """The process's admin client of the cluster, built (after a preflight) at first use and reused by every
    later call: building one costs a bootstrap and a metadata round trip, which dominated checks that run
    every few seconds. Calls on one client are serialised. A call that fails drops the client (and the
    cluster's passed preflight), so the next call starts from a new, checked connection; not one the broker
    refused (broker_refused): its connection is sound."""
    cluster = get(cluster)
    key = (os.getpid(), cluster.name, repr(cluster))
    with _shared_guard:
        entry = _shared.setdefault(key, (threading.Lock(), [None]))
        earlier = [other_entry for other, other_entry in _shared.items() if other[:2] == key[:2] and other != key]
    lock, slot = entry
    _close_idle(cluster.name, earlier)
    try:
        with lock:
            if slot[0] is None:
                slot[0] = admin(preflight(cluster))
            try:
                yield slot[0]
            except Exception as exc:
                if broker_refused(exc):
                    raise
                client, slot[0] = slot[0], None
                _passed.pop(repr(cluster), None)
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing a broken client must not hide why it broke
                    log.debug("closing the shared admin client of %s failed", cluster.name, exc_info=True)
                raise
    finally:
        if _shared.get(key) is not entry:   # the cluster left the clusters file during this call (_close_removed)
            _close_idle(cluster.name, [entry])


def _close_idle(name: str, entries: list) -> None:
    """Close the clients of a cluster's earlier settings (the clusters file changed or no longer has it): each has
    an IO thread that would go on reconnecting, for the life of the process, to brokers the cluster no longer
    names. One in use now is closed by a later call."""
    for lock, slot in entries:
        if not lock.acquire(blocking=False):
            continue
        try:
            client, slot[0] = slot[0], None
        finally:
            lock.release()
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a client of settings no longer used: nothing depends on it
                log.debug("closing an admin client of %s's earlier settings failed", name, exc_info=True)


def _close_removed(kept: set[str]) -> None:
    """Close the clients of clusters gone from the clusters file (`kept`: the names it holds now). Nothing asks
    for them again, so they would never reach _close_idle: each would keep its IO thread reconnecting for the
    life of the process. One in use now is closed when its call ends (shared_admin)."""
    with _shared_guard:
        gone = [key for key in _shared if key[0] == os.getpid() and key[1] != DEFAULT and key[1] not in kept]
        entries = {key: _shared.pop(key) for key in gone}
    for key, entry in entries.items():
        _close_idle(key[1], [entry])


def broker_refused(exc: BaseException) -> bool:
    """Whether `exc` is a broker's answer that no retry changes (an error code such as TOPIC_AUTHORIZATION_FAILED:
    no ACL), rather than a failed connection: asking again, on any client, gets the same answer."""
    return isinstance(exc, kafka_errors.BrokerResponseError) and not exc.retriable


def close_shared_admins() -> None:
    """Close this process's shared admin clients (tests, shutdown)."""
    with _shared_guard:
        entries = [entry for key, entry in _shared.items() if key[0] == os.getpid()]
    for lock, slot in entries:
        with lock:
            client, slot[0] = slot[0], None
            if client is not None:
                client.close()
