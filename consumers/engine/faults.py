"""Fault injection: end the process abruptly at a named step of the commit protocol.

`--crash-at after-write:0.3` makes every pass through `after-write` kill the process (SIGKILL, so no
cleanup, no `finally`, no transaction commit) with probability 0.3. `--crash-at after-write@3` kills it at
the third pass through `after-write` exactly: every batch passes each point once (each point counts its own
passes, so a writer thread running behind the poll loop does not shift the count), which makes a crash
schedule repeatable (the demo's seeded schedule). `after-db-commit@3/stop` stops the process there instead
(SIGSTOP: a hung process, a long GC pause, a stuck VM) until someone sends it SIGCONT. Used by chaos tests and
demos to reproduce every failure of every delivery mode.
"""
import os
import random
import signal
import sys

POINTS = (
    "after-poll",           # records polled, nothing written or committed
    "after-next-poll",      # the next batch polled while the previous one's transaction may still be open
    "after-kafka-commit",   # at-most-once: Kafka offset committed, rows not yet written
    "mid-write",            # part of the rows sent, DB transaction open
    "after-write",          # all rows written, DB transaction not committed
    "after-db-commit",      # DB committed, Kafka offset not yet committed
    # Dead-letter replay (consumers/operations/dead_letters.py):
    "replay-mid-write",     # part of the replayed rows written, transaction open
    "replay-after-write",   # rows, ledger, dead-letter removal and action log entry written, not committed
    "after-replay-commit",  # the replay committed, the caller not yet told
    # Ledger compaction (consumers/reconciliation/compaction.py):
    "compaction-mid-step",  # a run merged into its first row, the other rows not yet deleted, transaction open
)


class FaultInjector:
    def __init__(self, points: dict[str, float] | None = None, rng: random.Random | None = None,
                 at_pass: dict[str, set[int]] | None = None, in_worker: bool = False):
        self.points = dict(points or {})
        self.rng = rng or random.Random()
        self.at_pass = {point: set(numbers) for point, numbers in (at_pass or {}).items()}  # 1 = the first pass
        self.stop_at: set[tuple[str, int]] = set()   # (point, pass) where the process stops (SIGSTOP) instead
        self.passes: dict[str, int] = {}
        # Spark: every point is an executor task's, and the task's Python worker dies instead of the driver
        # (see consumers/engine/spark_commit.py); `at_pass` then numbers batch attempts, task retries included.
        self.in_worker = in_worker

    @classmethod
    def parse(cls, specs: list[str] | str | None, in_worker: bool = False) -> "FaultInjector":
        """Parse "POINT[:PROBABILITY]" and "POINT@PASS" items (a list, or one comma-separated string)."""
        if isinstance(specs, str):
            specs = [s for s in specs.split(",") if s]
        points, at_pass, stop_at = {}, {}, set()
        for spec in specs or []:
            if "@" in spec:
                point, _, number = spec.partition("@")
                number, stop, _ = number.partition("/stop")
                _check_point(point)
                if not number.isdigit() or int(number) < 1:
                    raise ValueError(f"Bad pass number {number!r} in {spec!r}: use a whole number from 1")
                at_pass.setdefault(point, set()).add(int(number))
                if stop:
                    stop_at.add((point, int(number)))
                continue
            point, _, probability = spec.partition(":")
            _check_point(point)
            try:
                p = float(probability) if probability else 1.0
            except ValueError:
                raise ValueError(f"Bad crash probability {probability!r} in {spec!r}") from None
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Crash probability must be within [0, 1], got {p}")
            points[point] = p
        faults = cls(points, at_pass=at_pass, in_worker=in_worker)
        faults.stop_at = stop_at
        return faults

    def armed(self, point: str) -> bool:
        return point in self.points or point in self.at_pass

    def maybe_crash(self, point: str) -> None:
        if point in self.at_pass:
            self.passes[point] = self.passes.get(point, 0) + 1
            if (point, self.passes[point]) in self.stop_at:
                sys.stderr.write(f"crash-at: fault {point}@{self.passes[point]} fired: SIGSTOP to pid {os.getpid()}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGSTOP)
            elif self.passes[point] in self.at_pass[point]:
                sys.stderr.write(f"crash-at: fault {point}@{self.passes[point]} fired: SIGKILL to pid {os.getpid()}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        probability = self.points.get(point)
        if probability and self.rng.random() < probability:
            # Say which fault fired before dying: SIGKILL leaves no other trace of it.
            sys.stderr.write(f"crash-at: fault {point} fired (p={probability:g}): SIGKILL to pid {os.getpid()}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def point_at(self, attempt: int) -> str | None:
        """The point where batch attempt `attempt` (1 = the first) is scheduled to crash, if any."""
        return next((point for point in POINTS if attempt in self.at_pass.get(point, ())), None)


def _check_point(point: str) -> None:
    if point not in POINTS:
        raise ValueError(f"Unknown crash point {point!r}: use one of {', '.join(POINTS)}")


NO_FAULTS = FaultInjector()
