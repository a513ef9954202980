"""What stands in front of the embedded broker so that TLS and SASL are tested for real.

The embedded broker cannot authenticate users on memory storage, and its own TLS listener does not work
with kafka-python (docs/embedded-broker.md). So the tests put a forwarder of ours in front of it:

- TLS: it terminates TLS with a certificate made in the test (tests/pki.py), optionally requiring a client
  certificate signed by the test CA (mutual TLS), and passes the plain bytes to the broker;
- SASL: it answers SaslHandshake and SaslAuthenticate itself -- PLAIN by comparing the password, SCRAM
  through the server side of `scramp` -- passes ApiVersions through (the broker advertises SaslHandshake
  v0-1 and SaslAuthenticate v0-2), refuses any other request before authentication as Kafka does, and
  after a successful authentication passes every byte through.

The broker advertises the forwarder's address (`start_broker(..., advertised=...)`), so every connection a
client opens after bootstrap goes through the forwarder too.

    with ForwardedBroker(tls=server_tls(pki), users={"tally": "pw"}, mechanisms=["SCRAM-SHA-256"]) as fb:
        fb.bootstrap    # "localhost:PORT", the address clients use
"""
import asyncio
import contextlib
import ssl
import struct
import threading
from pathlib import Path

import pytest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from scramp import ScramException, ScramMechanism

from consumers.kafka import broker, clusters
from tests.pki import make_pki

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58
# Real Kafka's words for a refused password.
REFUSED_MESSAGE = "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"


def server_tls(pki, require_client_certificate: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(pki.ca_file)
    return context


class Forwarder:
    """Listens on 127.0.0.1:`port` and forwards each connection to the broker at 127.0.0.1:`upstream_port`,
    terminating TLS (`tls`) and answering SASL (`users`: {name: password}, with `mechanisms` offered)."""

    def __init__(self, port: int, upstream_port: int, *, tls: ssl.SSLContext | None = None,
                 users: dict[str, str] | None = None, mechanisms: tuple[str, ...] = ("PLAIN",)):
        self.port, self.upstream_port, self.tls = port, upstream_port, tls
        self.users, self.mechanisms = users, tuple(mechanisms)
        self.authenticated: list[tuple[str, str]] = []   # (user, mechanism) of each session that authenticated
        self.refused: list[str] = []                     # why each refused session was refused
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"forwarder-{port}", daemon=True)
        self._server = None
        self._tasks: set = set()

    def start(self) -> "Forwarder":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        async def close():
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _listen(self):
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls,
                                                  ssl_handshake_timeout=10)

    async def _serve(self, reader, writer):
        task = asyncio.current_task()
        self._tasks.add(task)
        upstream = None
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            if self.users is None or await self._authenticate(reader, writer, *upstream):
                await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            for stream in (writer, upstream[1] if upstream else None):
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.close()

    async def _authenticate(self, reader, writer, up_reader, up_writer) -> bool:
        """Until the client has authenticated: ApiVersions goes to the broker, SaslHandshake and
        SaslAuthenticate are answered here, anything else ends the connection. True once authenticated."""
        mechanism = None
        exchange = None
        while True:
            frame = await _read_frame(reader)
            api_key, version = struct.unpack(">hh", frame[:4])
            if api_key == API_VERSIONS:
                up_writer.write(struct.pack(">i", len(frame)) + frame)
                await up_writer.drain()
                answer = await _read_frame(up_reader)
                writer.write(struct.pack(">i", len(answer)) + answer)
                await writer.drain()
            elif api_key == SASL_HANDSHAKE:
                request = SaslHandshakeRequest.decode(frame, version=version, header=True)
                offered = request.mechanism in self.mechanisms
                mechanism = request.mechanism if offered else None
                await _answer(writer, SaslHandshakeResponse(
                    version=version, error_code=0 if offered else UNSUPPORTED_SASL_MECHANISM,
                    mechanisms=list(self.mechanisms)), request.header.correlation_id)
                if not offered:
                    self.refused.append(f"mechanism {request.mechanism} not offered")
                    return False
            elif api_key == SASL_AUTHENTICATE and mechanism is not None:
                request = SaslAuthenticateRequest.decode(frame, version=version, header=True)
                exchange = exchange or _exchange(mechanism, self.users)
                reply, done, user = exchange(bytes(request.auth_bytes))
                if reply is None:
                    self.refused.append(f"{mechanism}: wrong credentials")
                    await _answer(writer, SaslAuthenticateResponse(
                        version=version, error_code=SASL_AUTHENTICATION_FAILED,
                        error_message=REFUSED_MESSAGE.format(mechanism), auth_bytes=b"", session_lifetime_ms=0),
                        request.header.correlation_id)
                    return False
                await _answer(writer, SaslAuthenticateResponse(
                    version=version, error_code=0, error_message=None, auth_bytes=reply, session_lifetime_ms=0),
                    request.header.correlation_id)
                if done:
                    self.authenticated.append((user, mechanism))
                    return True
            else:
                self.refused.append(f"request {api_key} before authentication")
                return False


def _exchange(mechanism: str, users: dict[str, str]):
    """The server side of one SASL exchange: a function from the client's bytes to (reply or None when
    refused, done, user)."""
    if mechanism == "PLAIN":
        def plain(message: bytes):
            parts = message.split(b"\0")
            if len(parts) != 3:
                return None, True, ""
            user, password = parts[1].decode(), parts[2].decode()
            return (b"", True, user) if users.get(user) == password else (None, True, user)
        return plain
    if mechanism == "OAUTHBEARER":
        # RFC 7628's client message: "n,,\x01auth=Bearer TOKEN\x01\x01". A token is accepted when it equals a
        # user's password (a stand-in for validating a signed token; the client side is what is under test).
        by_token = {password: user for user, password in users.items()}

        def oauthbearer(message: bytes):
            parts = message.decode(errors="replace").split("\x01")[1:]
            fields = dict(part.split("=", 1) for part in parts if "=" in part)
            token = fields.get("auth", "").removeprefix("Bearer ")
            user = by_token.get(token)
            return (b"", True, user) if user else (None, True, "")
        return oauthbearer

    scram = ScramMechanism(mechanism)
    credentials = {user: scram.make_auth_info(password, iteration_count=4096) for user, password in users.items()}
    state = {"step": 0, "user": ""}

    def lookup(user: str):
        state["user"] = user
        return credentials[user]

    server = scram.make_server(lookup)

    def scram_step(message: bytes):
        try:
            if state["step"] == 0:
                state["step"] = 1
                server.set_client_first(message.decode())
                return server.get_server_first().encode(), False, state["user"]
            server.set_client_final(message.decode())
            return server.get_server_final().encode(), True, state["user"]
        except (ScramException, KeyError):
            return None, True, state["user"]
    return scram_step


async def _read_frame(reader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def _answer(writer, response, correlation_id: int) -> None:
    response.with_header(correlation_id=correlation_id)
    writer.write(bytes(response.encode(framed=True, header=True)))
    await writer.drain()


async def _pipe(reader, writer) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class ForwardedBroker:
    """An embedded broker reachable only through a forwarder, which it advertises as `host`:port."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, users: dict[str, str] | None = None,
                 mechanisms: tuple[str, ...] = ("PLAIN",), host: str = "localhost", log_dir: Path | None = None):
        self.port, self.broker_port = broker.free_port(), broker.free_port()
        self.bootstrap = f"{host}:{self.port}"
        self.forwarder = Forwarder(self.port, self.broker_port, tls=tls, users=users, mechanisms=mechanisms)
        self.log_dir, self.process, self.log = log_dir, None, None

    def __enter__(self) -> "ForwardedBroker":
        if self.log_dir is not None:
            self.log = open(self.log_dir / f"test-broker-{self.broker_port}.log", "wb")
        self.process = broker.start_broker(self.broker_port, log_file=self.log, advertised=self.bootstrap)
        try:
            self.forwarder.start()
        except BaseException:
            broker.stop_broker(self.process)
            raise
        return self

    def __exit__(self, *exc) -> None:
        clusters.close_shared_admins()   # before the broker goes: they would keep reconnecting to it
        self.forwarder.stop()
        broker.stop_broker(self.process)
        if self.log is not None:
            self.log.close()


PASSWORD = "correct-horse-battery-staple-7"
KEY_PASSWORD = "client-key-unlock-3"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Certificates for "localhost"; the client key is encrypted with KEY_PASSWORD."""
    return make_pki(tmp_path_factory.mktemp("pki"), client_key_password=KEY_PASSWORD)


@pytest.fixture(scope="module")
def secure_broker(pki):
    """TLS + SASL (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN and OAUTHBEARER offered, user "tally" with PASSWORD, which
    is also its bearer token), as Confluent Cloud or MSK."""
    with ForwardedBroker(tls=server_tls(pki), users={"tally": PASSWORD},
                         mechanisms=("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "OAUTHBEARER")) as forwarded:
        yield forwarded
