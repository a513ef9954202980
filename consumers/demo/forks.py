"""The demo's pipeline processes, forked from a fork server that has Python and Django loaded.

A restart after a crash is what the demo shows; the few seconds a new interpreter spends importing Django,
Celery, kafka-python and the project before it can poll are not. So the demo starts multiprocessing's fork
server once per host process (a Celery worker, a test) with `consumers.demo.preload` imported, and each
pipeline run is a fresh process forked from it: its own PID, its own database and Kafka connections, and
SIGKILLed by its own fault point exactly like a process started from the shell. The fork server has never
opened a connection or started a thread, so forking it is safe.

A child runs the management command (`run_pipeline NAME ...`) with its output in a file, and this
process's database and broker settings (a test's database, a worker's broker): the fork server read the
environment once, when it started.
"""
import multiprocessing
import os
import sys
import tempfile
import threading

from django.conf import settings

PRELOAD = "consumers.demo.preload"
_lock = threading.Lock()
_context = None


def _fork_server():
    global _context
    with _lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([PRELOAD])
            _context = context
        return _context


def child_settings() -> dict:
    """What a child must share with this process, read now (tests change settings at run time)."""
    database = settings.DATABASES["default"]
    return {"database": {key: database[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")
                         if key in database},
            # The default cluster's settings (servers, TLS, SASL; secrets stay references) and the clusters file.
            "kafka": {name: getattr(settings, name) for name in dir(settings)
                      if name.startswith("KAFKA_") or name == "TALLY_KAFKA_CLUSTERS"}}


class ForkedCommand:
    """One management command run in a process forked from the fork server. `poll()` is None while it
    runs, then its exit code: 0, 1 for an error, -9 when a fault point SIGKILLed it."""

    def __init__(self, args: list[str]):
        log = tempfile.NamedTemporaryFile(prefix="tally-demo-", suffix=".log", delete=False)
        log.close()
        self.log_path = log.name
        self.process = _fork_server().Process(target=run_command, args=(args, child_settings(), self.log_path),
                                              name=f"tally-demo-{args[0]}", daemon=False)
        self.process.start()

    def poll(self) -> int | None:
        return self.process.exitcode

    def output(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def end(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(timeout=10)
        if self.process.exitcode is not None:   # a process still running cannot be closed
            self.process.close()
        try:
            os.unlink(self.log_path)
        except FileNotFoundError:
            pass


def run_command(args: list[str], shared: dict, log_path: str) -> None:
    """In the child: output to the log file, the parent's settings, then the command; exit 1 on error."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    import django
    from django.apps import apps

    if not apps.ready:   # the fork server could not preload (it says nothing): set up here instead
        django.setup()
    settings.DATABASES["default"].update(shared["database"])
    for name, value in shared["kafka"].items():
        setattr(settings, name, value)
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command(*args)
    except CommandError as exc:
        sys.stderr.write(f"CommandError: {exc}\n")
        sys.exit(1)
