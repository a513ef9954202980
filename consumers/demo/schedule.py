"""The demo's crash schedule: where each pipeline's consumer is killed, as a pure function of a seed.

Counting batch attempts over the whole run (attempt 0 is the first batch the first process polls, and a
restarted process goes on counting where the killed one stopped), the schedule says which attempts die
and at which fault point. Two kinds of crash:

- one **classic** crash per pipeline, at its mode's classic point (at-most-once: after the Kafka commit,
  before the write; at-least-once: after the write, before the Kafka commit; exactly-once: anywhere in the
  commit protocol), at an attempt below the number of full batches. Each attempt handles at most one batch,
  so a pipeline makes at least that many attempts: the classic crash always happens;
- on top of it, each attempt crashes with the chosen probability at one of the pipeline's crash points.

A process runs until its first scheduled crash; `process_specs` turns the attempt numbers into one
`--crash-at POINT@N` per process (die at the N-th pass through POINT), the last process runs without
faults. Same seed, same pipelines, same numbers: same crashes at the same batches.
"""
import random
from dataclasses import dataclass

from consumers.models import DeliveryMode

# Where each mode's lesson happens (consumers/engine/faults.py names the points).
CLASSIC_POINTS = {
    DeliveryMode.AT_MOST_ONCE: ("after-kafka-commit",),
    DeliveryMode.AT_LEAST_ONCE: ("after-db-commit",),
    DeliveryMode.EXACTLY_ONCE: ("mid-write", "after-write", "after-db-commit"),
}
MAX_SEED = 999_999   # six digits: easy to read off the page and type back


@dataclass(frozen=True)
class Crash:
    attempt: int   # the batch attempt, counted over every process of the run (0 = the first)
    point: str
    classic: bool


def crash_schedule(seed: int, pipeline: str, mode: str, points: tuple[str, ...], probability: float,
                   records: int, batch_size: int, max_crashes: int) -> tuple[Crash, ...]:
    """The crashes of one pipeline in one run, by attempt. Deterministic in its arguments."""
    if not 0.0 <= probability <= 1.0:
        raise ValueError("probability must be within [0, 1]")
    if max_crashes < 1:
        raise ValueError("max_crashes must be at least 1: the classic crash is the lesson")
    # A string seed hashes the same in every process (str hash randomisation does not apply to Random).
    rng = random.Random(f"{seed}:{pipeline}")
    full_batches = max(1, records // batch_size)
    classic_points = CLASSIC_POINTS[mode]
    if records < 2:
        # mid-write splits a batch in two halves: a one-record batch never passes it.
        classic_points = tuple(p for p in classic_points if p != "mid-write") or classic_points
    classic = Crash(rng.randrange(full_batches), rng.choice(classic_points), classic=True)
    crashes = {classic.attempt: classic}
    # Enough attempts for every batch plus a retry after each crash; later attempts are never reached.
    for attempt in range(full_batches + 1 + max_crashes):
        crash = rng.random() < probability
        point = rng.choice(points)   # drawn every time, so the draws do not depend on which attempts crash
        if crash and attempt not in crashes:
            crashes[attempt] = Crash(attempt, point, classic=False)
    ordered = sorted(crashes.values(), key=lambda c: c.attempt)
    kept = [c for c in ordered if not c.classic][: max_crashes - 1] + [classic]
    return tuple(sorted(kept, key=lambda c: c.attempt))


def process_specs(crashes: tuple[Crash, ...]) -> list[str]:
    """`--crash-at` values, one per process: process k dies at the n-th pass through its point, where
    n counts the batches since the previous process died. The process after the last crash has none."""
    specs, previous = [], -1
    for crash in crashes:
        specs.append(f"{crash.point}@{crash.attempt - previous}")
        previous = crash.attempt
    return specs
