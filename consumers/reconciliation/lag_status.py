"""Lag evaluation rules: a status per partition from its recent history, after Burrow's rules.

Burrow (linkedin/Burrow, "Consumer Lag Evaluation Rules") judges a consumer by a window of offset
samples instead of a lag threshold. Tally applies the same rules to the DATABASE's position (the one
its consumers resume from) and adds what reconciliation knows. In order, the first rule that matches:

  ERR     reconciliation found an incident in the partition: lost, duplicated or phantom records, a
          ledger gap or overlap, unrecoverable records (and: Kafka could not be read).
  REWIND  an operator rewound the pipeline within the window, or the position moved backwards: a planned
          replay, not an incident (Burrow's REWIND).
  OK      the lag was zero at some sample of the window, or is zero (or unknown) now (Burrow rule 1).
  STOP    lag > 0, the position has not moved for longer than the window, and no consumer is alive
          (Burrow rule 4: the consumer stopped).
  STALL   lag > 0, the position has not moved for longer than the window (or over every sample of a full
          window) while a consumer is alive (Burrow rule 2: a stalled consumer).
  WARN    the position moves but the lag grew or stayed the same in every interval of the window, and is
          higher at its end than at its start (Burrow rule 3: falling behind).
  OK      otherwise.

A pipeline's status is the worst of its partitions' (ERR > STOP > STALL > WARN > REWIND > OK).
"""
from dataclasses import dataclass
from datetime import datetime, timedelta

from consumers.models import Status

# Burrow evaluates a window of 10 offsets; WARN needs at least this many samples so one slow interval
# is not called a trend.
MIN_SAMPLES_FOR_TREND = 3

SEVERITY = {Status.OK: 0, Status.REWIND: 1, Status.WARN: 2, Status.STALL: 3, Status.STOP: 4, Status.ERR: 5}


@dataclass(frozen=True)
class Sample:
    taken_at: datetime
    position: int | None
    lag: int | None


@dataclass(frozen=True)
class PartitionFacts:
    """What the rules read about one partition now."""

    samples: list[Sample]            # the window's samples, oldest first, ending with the current one
    lag: int | None                  # lag in records now (None: unknown)
    moved_at: datetime | None        # when the DB position last changed
    consumer_alive: bool             # a live run (recent heartbeat) serves the pipeline
    rewound: bool                    # an operator rewind happened within the window
    incident: bool                   # reconciliation found loss, duplication, phantoms, gaps, ...
    now: datetime
    window: timedelta


def evaluate(facts: PartitionFacts) -> str:
    if facts.incident:
        return Status.ERR
    positions = [s.position for s in facts.samples if s.position is not None]
    went_back = any(b < a for a, b in zip(positions, positions[1:], strict=False))
    if facts.rewound or went_back:
        return Status.REWIND
    lags = [s.lag for s in facts.samples if s.lag is not None]
    if facts.lag is None or facts.lag <= 0 or any(lag <= 0 for lag in lags):
        return Status.OK
    idle_for = facts.now - facts.moved_at if facts.moved_at else None
    stuck = idle_for is not None and idle_for > facts.window
    full_window = (len(positions) >= MIN_SAMPLES_FOR_TREND
                   and facts.samples[-1].taken_at - facts.samples[0].taken_at >= facts.window * 0.9)
    if stuck and not facts.consumer_alive:
        return Status.STOP
    if stuck or (full_window and facts.consumer_alive and len(set(positions)) == 1):
        return Status.STALL
    if len(lags) >= MIN_SAMPLES_FOR_TREND and len(set(positions)) > 1:
        growing_every_interval = all(b >= a for a, b in zip(lags, lags[1:], strict=False))
        if growing_every_interval and lags[-1] > lags[0]:
            return Status.WARN
    return Status.OK


def worst(statuses) -> str:
    statuses = list(statuses)
    return max(statuses, key=lambda s: SEVERITY.get(s, 0)) if statuses else Status.OK
