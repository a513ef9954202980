"""Fault injection: end the process abruptly at a named step of the commit protocol.

`--crash-at after-write:0.3` makes every pass through `after-write` kill the process (SIGKILL, so no
cleanup, no `finally`, no transaction commit) with probability 0.3. Used by chaos tests and demos to
reproduce every failure of every delivery mode.
"""
import os
import random
import signal
import sys

POINTS = (
    "after-poll",           # records polled, nothing written or committed
    "after-kafka-commit",   # at-most-once: Kafka offset committed, rows not yet written
    "mid-write",            # part of the rows sent, DB transaction open
    "after-write",          # all rows written, DB transaction not committed
    "after-db-commit",      # DB committed, Kafka offset not yet committed
)


class FaultInjector:
    def __init__(self, points: dict[str, float] | None = None, rng: random.Random | None = None):
        self.points = dict(points or {})
        self.rng = rng or random.Random()

    @classmethod
    def parse(cls, specs: list[str] | str | None) -> "FaultInjector":
        """Parse "POINT[:PROBABILITY]" items (a list, or one comma-separated string)."""
        if isinstance(specs, str):
            specs = [s for s in specs.split(",") if s]
        points = {}
        for spec in specs or []:
            point, _, probability = spec.partition(":")
            if point not in POINTS:
                raise ValueError(f"Unknown crash point {point!r}: use one of {', '.join(POINTS)}")
            try:
                p = float(probability) if probability else 1.0
            except ValueError:
                raise ValueError(f"Bad crash probability {probability!r} in {spec!r}") from None
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"Crash probability must be within [0, 1], got {p}")
            points[point] = p
        return cls(points)

    def armed(self, point: str) -> bool:
        return point in self.points

    def maybe_crash(self, point: str) -> None:
        probability = self.points.get(point)
        if probability and self.rng.random() < probability:
            # Say which fault fired before dying: SIGKILL leaves no other trace of it.
            sys.stderr.write(f"crash-at: fault {point} fired (p={probability:g}): SIGKILL to pid {os.getpid()}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = FaultInjector()
