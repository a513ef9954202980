"""One pipeline in N engine processes at once (`manage.py run_pipeline NAME --processes N`).

Python holds one core per process (the GIL), so a pipeline whose records cost more Python than one core
gives is run in several processes. They are ordinary runs of the pipeline: consumers/engine/shares.py splits
the partitions among them and the commit protocol keeps each record exactly once whatever they do. Each is
started with `--peers N` so that it waits for the others before taking its share.
"""
import json
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings


@dataclass
class ProcessOutcome:
    exit_code: int
    result: dict | None   # the run's RunResult as JSON, when it got as far as printing it
    error: str = ""


def run_in_processes(name: str, processes: int, run_args: list[str]) -> list[ProcessOutcome]:
    """Start `processes` runs of pipeline `name` (each `manage.py run_pipeline NAME *run_args --peers N
    --json`), pass SIGTERM/SIGINT on to them, and wait for all of them."""
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_pipeline", name, *run_args,
               "--peers", str(processes), "--json"]
    return run_children([command] * processes)


def run_children(commands: list[list[str]]) -> list[ProcessOutcome]:
    """Run the commands at once, pass SIGTERM/SIGINT on to them, and wait for all of them.

    Every child's pipes are read at once, each by a thread of its own: a child whose log outgrew the pipe
    (64 KiB) while the parent waited on another would block on its next log line, holding its partitions."""
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for command in commands]

    def pass_on(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ThreadPoolExecutor(max_workers=len(children)) as pool:
            return list(pool.map(_drain, children))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_log_lock = threading.Lock()


def _drain(child: subprocess.Popen) -> ProcessOutcome:
    """Pass the child's log on as it comes (as a single run would have written it) and read its result."""
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.extend(child.stdout), daemon=True)
    reader.start()
    errors = []
    for line in child.stderr:
        with _log_lock:  # whole lines: the children's logs interleave line by line, never mid-line
            sys.stderr.write(line)
        if line.startswith("CommandError:"):
            errors.append(line.rstrip("\n"))
    reader.join()
    child.wait()
    result = None
    for line in stdout:
        if line.startswith("{"):
            result = json.loads(line)
    return ProcessOutcome(child.returncode, result, errors[-1] if errors else "")


def combined_busy_seconds(results: list[dict]) -> float:
    """From the first record any of the runs fetched to the last batch any of them committed."""
    spans = [(r["busy_from"], r["busy_until"]) for r in results if r.get("busy_from") and r.get("busy_until")]
    if not spans:
        return 0.0
    return max(until for _, until in spans) - min(start for start, _ in spans)
