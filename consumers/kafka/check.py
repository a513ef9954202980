"""`kafka check`: connect to a cluster step by step and say which step failed and why.

Steps, in order: settings (files and secrets load), resolve (DNS), connect (TCP, then Kafka's ApiVersions),
tls (handshake and certificate checks), authenticate (SASL), metadata (brokers, topics; every advertised
broker accepts a connection). kafka-python's clients retry a failing bootstrap for the whole request
timeout and only log why; this walks the same steps once, on blocking sockets with one deadline, with
kafka-python's own protocol classes and SASL mechanisms, so a wrong CA, a host-name mismatch, a bad password,
an unsupported mechanism or an unreachable broker is reported in seconds. No message holds a secret.
"""
import socket
import ssl
import time
from dataclasses import dataclass, field

from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from consumers.kafka import clusters
from consumers.kafka.errors import ClusterConfigError, ClusterUnavailable

# Long enough for a TLS handshake and SCRAM across an ocean, short enough for a web request.
CHECK_TIMEOUT_S = 5.0
UNREACHABLE, TLS, AUTHENTICATION, SETTINGS = "unreachable", "TLS verification", "authentication", "settings"


class StepFailed(Exception):
    def __init__(self, step: str, cause: str, detail: str):
        super().__init__(detail)
        self.step, self.cause, self.detail = step, cause, detail


@dataclass
class CheckResult:
    cluster: str
    bootstrap_servers: str
    protocol: str
    mechanism: str
    warning: str = ""       # Cluster.warning: settings that work but expose a secret
    ok: bool = False
    step: str = ""          # the step that failed
    cause: str = ""         # unreachable, TLS verification, authentication, settings
    detail: str = ""
    passed: list[str] = field(default_factory=list)   # the steps that passed, in order
    brokers: list[str] = field(default_factory=list)
    topics: int | None = None
    seconds: float = 0.0

    @property
    def error(self) -> str:
        return "" if self.ok else str(self.exception())

    def exception(self) -> ClusterUnavailable | ClusterConfigError:
        if self.cause == SETTINGS:
            return ClusterConfigError(self.cluster, self.detail)
        return ClusterUnavailable(self.cluster, self.step, self.cause, self.detail)

    def raise_for_failure(self) -> None:
        if not self.ok:
            raise self.exception()

    def as_dict(self) -> dict:
        return {"cluster": self.cluster, "bootstrap_servers": self.bootstrap_servers, "protocol": self.protocol,
                "mechanism": self.mechanism, "warning": self.warning or None, "ok": self.ok, "step": self.step or None,
                "cause": self.cause or None, "error": self.error or None, "passed": self.passed,
                "brokers": self.brokers, "topics": self.topics, "seconds": round(self.seconds, 3)}


def check_cluster(cluster, timeout_s: float = CHECK_TIMEOUT_S, read_metadata: bool = True) -> CheckResult:
    """Walk the steps against each bootstrap server until one passes them all. `read_metadata=False`
    (the preflight of every client) asks for the brokers but no topic list."""
    started = time.monotonic()
    if not isinstance(cluster, clusters.Cluster):
        try:
            cluster = clusters.get(cluster)
        except ClusterConfigError as exc:
            name = str(cluster or clusters.DEFAULT)
            # Another cluster's table (or the file itself) may be what is wrong: the problem names where.
            detail = exc.problem if exc.cluster == name else f"the clusters file is invalid: {exc.problem}"
            return CheckResult(name, "", "", "", step="settings", cause=SETTINGS,
                               detail=detail, seconds=time.monotonic() - started)
    result = CheckResult(cluster.name, cluster.bootstrap_servers, cluster.security_protocol, cluster.mechanism,
                         cluster.warning)
    deadline = started + timeout_s
    try:
        try:
            kwargs = clusters.client_kwargs(cluster)
        except ClusterConfigError as exc:
            raise StepFailed("settings", SETTINGS, exc.problem) from None
        result.passed.append("settings")
        failure, failure_passed = None, []
        for host, port in cluster.servers:
            passed = list(result.passed)
            try:
                _walk(cluster, kwargs, host, port, deadline, read_metadata, result)
                failure = None
                break
            except StepFailed as exc:
                # The server that got furthest says what is wrong (a refused password, not a broker that is
                # down), with the steps it passed.
                if failure is None or len(result.passed) > len(failure_passed):
                    failure, failure_passed = exc, list(result.passed)
                result.passed = passed
        if failure is not None:
            result.passed = failure_passed
            raise failure
        result.ok = True
    except StepFailed as exc:
        result.step, result.cause, result.detail = exc.step, exc.cause, scrub(exc.detail, cluster)
    result.seconds = time.monotonic() - started
    return result


def scrub(text: str, cluster: clusters.Cluster) -> str:
    """Belt and braces: whatever a broker or a library put in a message, a secret's value never leaves."""
    for secret in cluster.secret_values():
        text = text.replace(secret, "***")
    return text


def _remaining(deadline: float, step: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise StepFailed(step, UNREACHABLE, "no answer within the check's time limit")
    return left


def _walk(cluster, kwargs: dict, host: str, port: int, deadline: float, read_metadata: bool, result) -> None:
    where = f"{host}:{port}"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise StepFailed("resolve", UNREACHABLE, f"cannot resolve {host}: {getattr(exc, 'strerror', exc)}") from None
    result.passed.append("resolve")
    try:
        sock = socket.create_connection((host, port), timeout=_remaining(deadline, "connect"))
    except TimeoutError:
        raise StepFailed("connect", UNREACHABLE, f"no answer from {where} (a firewall, or the wrong port? see "
                                                 f"{_servers_setting(cluster)})") from None
    except OSError as exc:
        raise StepFailed("connect", UNREACHABLE, f"no broker accepts connections at {where}: {exc.strerror or exc} "
                                                 f"(is Kafka running? see {_servers_setting(cluster)})") from None
    try:
        if cluster.uses_tls:
            sock = _handshake(cluster, kwargs["ssl_context"], sock, host, where, deadline)
        conversation = _Conversation(sock, deadline, cluster, where)
        conversation.request(ApiVersionsRequest(version=0), "tls" if cluster.uses_tls else "connect")
        if not cluster.uses_tls:
            result.passed.append("connect")
        else:
            result.passed.extend(["connect", "tls"])
        if cluster.uses_sasl:
            _authenticate(cluster, kwargs, conversation, host)
            result.passed.append("authenticate")
        metadata = conversation.request(MetadataRequest(version=1, topics=None if read_metadata else []),
                                        "metadata")
        brokers = [(b.node_id, b.host, b.port) for b in metadata.brokers]
        result.brokers = [f"{h}:{p} (id {i})" for i, h, p in brokers]
        result.topics = len(metadata.topics) if read_metadata else None
        _check_advertised(brokers, deadline)
        result.passed.append("metadata")
    finally:
        sock.close()


def _servers_setting(cluster) -> str:
    return "KAFKA_BOOTSTRAP_SERVERS" if cluster.name == clusters.DEFAULT else f"bootstrap_servers of {cluster.source}"


def _handshake(cluster, context: ssl.SSLContext, sock, host: str, where: str, deadline: float):
    sock.settimeout(_remaining(deadline, "tls"))
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise StepFailed("tls", TLS, _verify_hint(cluster, host, exc.verify_message or str(exc))) from None
    except ssl.SSLError as exc:
        sock.close()
        raise StepFailed("tls", TLS, f"the TLS handshake with {where} failed: {exc.reason or exc} "
                                     "(does this port speak TLS? a client certificate required?)") from None
    except (TimeoutError, OSError) as exc:
        sock.close()
        raise StepFailed("tls", TLS, f"no TLS handshake with {where}: {exc.strerror or 'no answer'} "
                                     "(does this port speak TLS?)") from None


def _verify_hint(cluster, host: str, message: str) -> str:
    if "mismatch" in message.lower():
        return (f"the broker's certificate does not name {host!r} ({message}): connect by a name the certificate "
                "holds, or set ssl_check_hostname to false")
    ca = f"ssl_cafile ({cluster.ssl_cafile})" if cluster.ssl_cafile else "the system's CAs (no ssl_cafile set)"
    return f"the broker's certificate is not trusted by {ca}: {message}"


class _Conversation:
    """Requests and replies on one blocking socket, framed by kafka-python's protocol parser."""

    def __init__(self, sock, deadline: float, cluster, where: str):
        self.sock, self.deadline, self.cluster, self.where = sock, deadline, cluster, where
        self.protocol = KafkaProtocol(client_id="tally-check", receive_message_max_bytes=64 << 20)

    def request(self, request, step: str):
        self.protocol.send_request(request)
        try:
            self.sock.settimeout(_remaining(self.deadline, step))
            self.sock.sendall(self.protocol.send_bytes())
            while True:
                self.sock.settimeout(_remaining(self.deadline, step))
                data = self.sock.recv(1 << 16)
                if not data:
                    raise StepFailed(step, *self._closed(step))
                replies = self.protocol.receive_bytes(data)
                if replies:
                    return replies[0][1]
        except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate arrives with the first reply
            raise StepFailed("tls", TLS, f"{self.where} ended the TLS session: {exc.reason or exc} (the broker "
                                         "may require a client certificate: ssl_certfile and ssl_keyfile)") from None
        except TimeoutError:
            raise StepFailed(step, *self._silent(step)) from None
        except OSError as exc:
            raise StepFailed(step, *self._closed(step, exc.strerror)) from None
        except StepFailed:
            raise
        except Exception as exc:   # a reply that is not Kafka's (frame size, decoding)
            raise StepFailed(step, UNREACHABLE, f"{self.where} answered something that is not Kafka "
                                                f"({type(exc).__name__}){self._protocol_hint()}") from None

    def _protocol_hint(self) -> str:
        protocol = self.cluster.security_protocol
        if protocol == "PLAINTEXT":
            return "; does it expect TLS or SASL? security_protocol is PLAINTEXT"
        if protocol == "SASL_PLAINTEXT":
            return "; does it expect TLS? security_protocol is SASL_PLAINTEXT"
        return ""

    def _closed(self, step: str, reason: str | None = None) -> tuple[str, str]:
        if step == "tls":   # TLS 1.3: a broker refusing the client's certificate hangs up after the handshake
            certificate = ("the broker may not accept the client certificate" if self.cluster.ssl_certfile
                           else "the broker may require a client certificate: ssl_certfile and ssl_keyfile")
            raise StepFailed("tls", TLS, f"{self.where} ended the TLS session after the handshake ({certificate})")
        cause = AUTHENTICATION if step == "authenticate" else UNREACHABLE
        return cause, (f"{self.where} closed the connection" + (f" ({reason})" if reason else "")
                       + self._protocol_hint())

    def _silent(self, step: str) -> tuple[str, str]:
        return UNREACHABLE, f"{self.where} did not answer within the time limit{self._protocol_hint()}"


def _authenticate(cluster, kwargs: dict, conversation: _Conversation, host: str) -> None:
    wanted = cluster.sasl_mechanism
    reply = conversation.request(SaslHandshakeRequest(version=1, mechanism=wanted), "authenticate")
    offered = list(reply.mechanisms or [])
    if reply.error_code or wanted not in offered:
        raise StepFailed("authenticate", AUTHENTICATION,
                         f"the broker does not offer SASL {wanted} (it offers {', '.join(offered) or 'none'}): "
                         "set sasl_mechanism to one of those")
    try:
        mechanism = get_sasl_mechanism(wanted)(host=host, **kwargs)
        while not mechanism.is_done():
            answer = conversation.request(SaslAuthenticateRequest(version=1, auth_bytes=mechanism.auth_bytes()),
                                          "authenticate")
            if answer.error_code:
                said = f": {answer.error_message}" if answer.error_message else ""
                raise StepFailed("authenticate", AUTHENTICATION,
                                 f"the broker refused user {cluster.sasl_username!r} with {wanted}{said} "
                                 "(a wrong user name or password?)")
            mechanism.receive(answer.auth_bytes)
    except StepFailed:
        raise
    except Exception as exc:   # e.g. SCRAM: the server's proof did not match (a broker that is not who it says)
        raise StepFailed("authenticate", AUTHENTICATION, f"SASL {wanted} failed: {type(exc).__name__}: {exc}") from None
    if not mechanism.is_authenticated():
        raise StepFailed("authenticate", AUTHENTICATION, f"SASL {wanted} did not complete")


def _check_advertised(brokers: list[tuple], deadline: float) -> None:
    """Clients connect to the addresses the brokers advertise, not to the bootstrap servers: a broker behind
    a proxy or NAT that advertises an internal address fails every client after a good bootstrap."""
    if not brokers:
        raise StepFailed("metadata", UNREACHABLE, "the cluster's metadata lists no broker")
    for node_id, host, port in brokers:
        try:
            socket.create_connection((host, port), timeout=min(2.0, _remaining(deadline, "metadata"))).close()
        except OSError as exc:
            raise StepFailed("metadata", UNREACHABLE,
                             f"broker {node_id} advertises {host}:{port}, which does not accept connections "
                             f"({exc.strerror or 'no answer'}): check the brokers' advertised listeners") from None
