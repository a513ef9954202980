"""Local HTTP receivers for alert channels (http.server in a thread, on loopback): they keep every request
and answer as told — 2xx, 500 (with the headers given), or not at all until released (too slow for the
client's timeout); and one that trickles its answer a byte at a time (TricklingReceiver)."""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from consumers.kafka.broker import free_port

# How long a "slow" receiver holds a request at most; the client gives up long before (its timeout).
HOLD_LIMIT_SECONDS = 30


class Receiver:
    def __init__(self, port: int | None = None, status: int = 200, text: str = "ok"):
        self.port = port or free_port()
        self.status, self.text = status, text
        self.headers: dict[str, str] = {}  # sent with every answer (e.g. Retry-After)
        self.requests: list[dict] = []
        self.answers: list[tuple[int, str]] = []   # (status, text) for the next requests, in turn; then status, text
        self.slow = False
        self.release = threading.Event()
        self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bodies(self) -> list[dict]:
        return [json.loads(request["body"]) for request in self.requests]

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.slow:
                    receiver.release.wait(HOLD_LIMIT_SECONDS)
                    return  # the client has gone: no answer
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, text = receiver.answers.pop(0) if receiver.answers else (receiver.status, receiver.text)
                answer = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        # shutdown() waits for the loop's next poll: the default half second, paid by every test that stops one.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class TricklingReceiver:
    """A raw-socket receiver that answers `status` at once, then sends its body one byte every `interval` seconds:
    each byte comes well within a socket read timeout, the whole body long after it. Serves one request."""

    def __init__(self, body: bytes = b"accepted-slowly-byte-by-byte", interval: float = 0.3, status: str = "200 OK"):
        self.body, self.interval, self.status = body, interval, status
        self.stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def seconds(self) -> float:
        """How long sending the whole body takes."""
        return len(self.body) * self.interval

    def start(self) -> "TricklingReceiver":
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return   # stopped before a request came
        with connection:
            request = b""
            while b"\r\n\r\n" not in request and (chunk := connection.recv(65536)):
                request += chunk
            head = f"HTTP/1.1 {self.status}\r\nContent-Type: text/plain\r\nContent-Length: {len(self.body)}\r\n\r\n"
            try:
                connection.sendall(head.encode())
                for byte in self.body:
                    if self.stopped.wait(self.interval):   # the trickle's pace; stop() ends it at once
                        return
                    connection.sendall(bytes([byte]))
            except OSError:
                return   # the client has gone

    def stop(self) -> None:
        self.stopped.set()
        self._listener.close()
