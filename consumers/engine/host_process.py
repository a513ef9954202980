"""The engine host process (`manage.py engine_host`): hosts many pipeline runs, one thread each, for the
Celery worker that started it (consumers/engine/hosts.py has the worker's side and the why).

Commands arrive as JSON lines on stdin: `{"op": "run", "key", "pipeline_id", "epoch", "task_id", "settled_peers"}`
starts a run, `{"op": "stop", "key"}` asks one run (or every run, key "*") to stop cleanly, `{"op": "ping"}` is
answered with a line of key "" (the worker kills a host silent for a run's lease). Each run's result goes
back as one JSON line `{"key", "result"}` on the process's original stdout; everything else printed goes to
stderr, so nothing else can corrupt that channel. When stdin closes (the worker is gone), on SIGTERM (even while
the worker lives on) or when the worker asks every run to stop (its warm shutdown), every run is asked to stop, and
the process exits once they have ended: commands are read on a thread of their own, so the main thread is never
stuck in a read of stdin when the signal comes.

A run that has not ended STOP_LIMIT_S after that (stuck in its transform, say in a call that never returns) does
not keep the process: its row is declared crashed with the reason and the process exits. Otherwise a host whose
worker was gone would live on for good, orphaned, its beat keeping the stuck run's lease, so the supervisor would
never restart the pipeline; and a worker's warm shutdown would wait for it for ever. Its open transaction, if any,
ends with the process (rolled back), so nothing of its batch is written.
"""
import json
import logging
import os
import signal
import socket
import sys
import threading
import time

from django.db import connection
from django.utils import timezone

from consumers.engine import db, runs

log = logging.getLogger("tally.runs")

STOP_ALL = "*"

# How long runs asked to stop may take before the process leaves without them. A run ends within a few seconds (its
# batch, then its consumer's close, up to 5 s); the limit stays below the 10 s that `docker compose stop` waits
# before it kills the container, so the stuck runs are declared crashed with their reason, not cut off silently.
STOP_LIMIT_S = 8.0


class HostProcess:
    def __init__(self, results):
        self.results = results
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.closing = threading.Event()   # stdin closed or SIGTERM: no new run, every run asked to stop
        self.reason = ""
        # Closing wakes the main thread through a pipe: a write is safe in a signal handler, where taking a lock
        # the interrupted main thread may hold (an Event's) is not.
        self._wake_read, self._wake_write = os.pipe()

    def serve(self, commands) -> None:
        # Every other thread is made by the command reader, or by a thread it made (runs, their consumers' threads),
        # and inherits its signal mask: with SIGTERM blocked there, the kernel hands SIGTERM to the main thread, the
        # one whose read below it interrupts. Handed to another thread, it would run no handler (Python runs them on
        # the main thread only, when it wakes), and the main thread would sleep on, the host never stopping.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            threading.Thread(target=self._read, args=(commands,), name="tally-engine-host-commands",
                             daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.read(self._wake_read, 1)
        with self._lock:
            self.closing.set()
            threads = list(self.threads)
        # A run that was starting as the stop came may not have been listening for it yet: ask until all ended.
        deadline = time.monotonic() + STOP_LIMIT_S
        while any(thread.is_alive() for thread in threads) and time.monotonic() < deadline:
            runs.stop_all_runs(self.reason)
            for thread in threads:
                thread.join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        stuck = [thread for thread in threads if thread.is_alive()]
        if stuck:
            self._leave_stuck_runs(len(stuck))

    def _leave_stuck_runs(self, count: int) -> None:
        """Declare the runs that did not stop crashed, with the reason, and end the process now: the stuck threads
        would hold it (and their leases, through its beat) for ever."""
        reason = (f"did not stop within {STOP_LIMIT_S:.0f} s of being asked ({self.reason}): "
                  f"engine host pid {os.getpid()} exited without it")
        log.error("engine host: %d run(s) %s", count, reason)
        from consumers.models import ConsumerRun

        try:
            ConsumerRun.objects.filter(host=socket.gethostname(), pid=os.getpid()).declare_crashed(reason,
                                                                                                   timezone.now())
            connection.close()
        except Exception:  # the process must end all the same: the worker, or the lease, tells of the runs then
            log.exception("engine host: the runs that did not stop could not be declared crashed")
        self.results.flush()
        os._exit(1)   # not sys.exit: the stuck threads, and Python's shutdown waiting on them, must not hold it

    def close(self, reason: str) -> None:
        """Stop taking runs and end the ones held (from the command reader at EOF, or the SIGTERM handler)."""
        self.reason = self.reason or reason
        os.write(self._wake_write, b"x")

    def _read(self, commands) -> None:
        # However the commands end -- their end of file (the worker is gone), or an error, such as the answer to a
        # ping the worker sent as it died meeting a closed results pipe (BrokenPipeError) -- the host closes: else
        # the main thread would wait for ever, orphaned, holding its runs' leases.
        try:
            for line in commands:
                try:
                    command = json.loads(line)
                except ValueError:
                    log.warning("engine host: not a command: %.200s", line)
                    continue
                if command.get("op") == "run":
                    self._start(command)
                elif command.get("op") == "stop":
                    self._stop(command.get("key"), command.get("reason") or "asked by the worker")
                elif command.get("op") == "ping":
                    self._write("", {"pong": True})   # the worker's watchdog (hosts.py) kills a host that stays silent
        except BrokenPipeError:
            pass   # the results pipe closed: its worker is gone
        finally:
            self.close(f"its worker is gone: engine host pid {os.getpid()} saw its commands end and stopped its runs")

    def _start(self, command: dict) -> None:
        with self._lock:
            if not self.closing.is_set():
                thread = threading.Thread(target=self._run, args=(command,), daemon=True,
                                          name=f"tally-run-{command['pipeline_id']}-{command['epoch']}")
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
                thread.start()
                return
        self._write(command["key"], {"reason": "error", "records": 0, "detail": "its engine host was stopping"})

    def _run(self, command: dict) -> None:
        db.take_turn()   # released once the run consumes (python.py) and again at its end: see db.take_turn
        try:
            result = runs.run_here(command["pipeline_id"], command["epoch"], task_id=command.get("task_id", ""),
                                   settled_peers=command.get("settled_peers", 0), key=command["key"])
        except Exception as exc:  # the worker must hear of every run's end
            log.exception("engine host: run %s failed", command["key"])
            result = {"reason": "error", "detail": f"{type(exc).__name__}: {exc}", "records": 0}
        finally:
            db.end_turn()  # this thread's Django connection: a host outlives many runs
        self._write(command["key"], result)

    def _write(self, key: str, result: dict) -> None:
        with self._write_lock:
            self.results.write(json.dumps({"key": key, "result": result}, default=str) + "\n")
            self.results.flush()

    def _stop(self, key: str | None, reason: str) -> None:
        if key == STOP_ALL:
            # Only the worker's warm shutdown asks it: the host ends with its runs, as when its worker is gone.
            runs.stop_all_runs(reason)
            self.close(reason)
        elif key:
            runs.stop_run(key, reason, before_start=True)   # sent with its run, it may come before the run begins


def main() -> None:
    # The results channel is a private copy of stdout; fd 1 then points at stderr, so a stray print or a
    # library's output lands in the log, never in a result line.
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    host = HostProcess(results)
    # The handler only sets an event: the main thread, waiting for it, stops the runs and waits for their end.
    signal.signal(signal.SIGTERM, lambda signum, frame: host.close("engine host got SIGTERM"))
    # Ctrl-C (SIGINT) and Ctrl-\ (SIGQUIT) on the worker's terminal reach its whole group: the worker decides, and
    # asks the host to stop its runs (a host killed by SIGQUIT's default action would crash them mid-batch).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    host.serve(sys.stdin)
