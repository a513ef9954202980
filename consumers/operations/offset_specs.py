"""Where to move a consumer: the reset modes of `kafka-consumer-groups`, parsed, validated and resolved.

One home for both Tally pipelines (rewind) and consumer groups Tally does not run (group reset):
  to-earliest · to-latest · to-current · to-offset N · to-datetime ISO-8601 · by-duration ISO-8601 · shift-by ±N

`parse_spec` refuses bad input (unparseable, datetime in the future or before 1970, negative or
overflowing duration, offsets beyond 64 bits) before anything is read from Kafka; `resolve_offsets`
turns a spec into a new offset per partition and refuses a target outside [log start, high watermark]
— nothing is clamped silently, so nothing moves that the operator did not ask for.
"""
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime, parse_duration
from kafka.errors import KafkaError

from consumers.kafka import admin as kafka_admin
from consumers.operations.errors import Invalid, Refused, as_refusal

# Kafka timestamps are milliseconds since 1970: earlier moments would become its special values -1/-2
# ("latest"/"earliest") in ListOffsets, so they are refused, not sent.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_OFFSET = 2**63 - 1   # Kafka offsets and the database's next_offset are signed 64-bit integers
MAX_PARTITION = 2**31 - 1  # Kafka partitions are int32

OFFSET_MODES = ("to-earliest", "to-latest", "to-current", "to-offset", "to-datetime", "by-duration", "shift-by")
MODES_WITH_VALUE = ("to-offset", "to-datetime", "by-duration", "shift-by")


@dataclass(frozen=True)
class OffsetSpec:
    mode: str
    offset: int | None = None          # to-offset, shift-by
    moment: datetime | None = None     # to-datetime, by-duration (resolved against "now" when parsed)
    raw: str = ""                      # the value as the operator gave it, for the action log

    def describe(self) -> str:
        return f"{self.mode} {self.raw}".strip()

    def params(self) -> dict:
        return {"mode": self.mode, "value": self.raw or None}


def parse_spec(mode: str, value=None, now: datetime | None = None) -> OffsetSpec:
    """Parse a mode and its value; raise Refused with a clear message on bad input."""
    now = now or timezone.now()
    if mode not in OFFSET_MODES:
        raise Refused(f"Unknown mode {mode!r}: use one of {', '.join(OFFSET_MODES)}.")
    raw = "" if value is None else str(value).strip()
    if any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF for c in raw):
        # NUL and lone surrogates cannot be stored in the action log (PostgreSQL refuses them): refuse here.
        raise Refused(f"The value of {mode} holds a control character or an unpaired surrogate.")
    if mode not in MODES_WITH_VALUE:
        if raw:
            raise Refused(f"{mode} takes no value (got {raw!r}).")
        return OffsetSpec(mode)
    if not raw:
        raise Refused(f"{mode} needs a value.")
    if mode in ("to-offset", "shift-by"):
        try:
            number = int(raw)
        except ValueError:
            raise Refused(f"{mode} needs an integer, got {raw!r}.") from None
        if mode == "to-offset" and number < 0:
            raise Refused(f"to-offset needs an offset >= 0, got {number}.")
        if abs(number) > MAX_OFFSET:
            raise Refused(f"{mode} needs a number within ±{MAX_OFFSET} (a 64-bit offset), got {raw[:40]!r}.")
        return OffsetSpec(mode, offset=number, raw=raw)
    if mode == "to-datetime":
        return OffsetSpec(mode, moment=parse_moment(raw, now), raw=raw)
    duration = _parse_duration(raw)
    try:
        moment = now - duration
    except OverflowError:
        moment = None
    if moment is None or moment < EPOCH:
        raise Refused(f"by-duration {raw} reaches back before 1970-01-01, where Kafka timestamps begin.")
    return OffsetSpec(mode, moment=moment, raw=raw)


def validate(mode: str, value=None, now: datetime | None = None) -> OffsetSpec:
    """The one check of an offset move's input, for every door (page, API, command): the spec, or Invalid
    naming the field at fault (the value, or the mode when it takes no value)."""
    try:
        return parse_spec(mode, value, now)
    except Refused as exc:
        raise Invalid({"value" if mode in MODES_WITH_VALUE else "mode": str(exc)}) from None


def parse_moment(raw: str, now: datetime, what: str = "to-datetime") -> datetime:
    """A time Kafka can look offsets up by (a rewind's to-datetime, a watch's start): ISO-8601, not in the
    future, not before 1970. Refused names `what`."""
    moment = _parse_moment(raw, what)
    if moment > now:
        raise Refused(f"{what} {raw} is in the future (now is {now.isoformat(timespec='seconds')}).")
    if moment < EPOCH:
        raise Refused(f"{what} {raw} is before 1970-01-01, where Kafka timestamps begin.")
    return moment


def _parse_moment(raw: str, what: str) -> datetime:
    try:
        moment = parse_datetime(raw)
        # A time without a zone is taken as UTC, as the dashboard shows times in UTC.
        moment = moment if moment is None or timezone.is_aware(moment) else moment.replace(tzinfo=UTC)
        if moment is not None:
            moment.astimezone(UTC)  # an offset can push year 1 or 9999 out of range: refuse it here
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        raise Refused(f"{what} needs an ISO-8601 date and time (e.g. 2026-11-22T04:00:00Z), got {raw!r}.")
    return moment


def _parse_duration(raw: str) -> timedelta:
    # Django's parser accepts ISO-8601 durations with days, hours, minutes and seconds (PT10M, P1D, P1DT2H).
    # Months and years have no fixed length, so they are refused rather than guessed.
    try:
        duration = parse_duration(raw) if raw.upper().startswith(("P", "-P", "+P")) else None
    except (OverflowError, ValueError):  # e.g. P9999999999D: more days than a timedelta holds
        duration = None
    if duration is None:
        raise Refused(f"by-duration needs an ISO-8601 duration in days, hours, minutes or seconds "
                      f"(e.g. PT10M, PT1H30M, P1D), got {raw!r}.")
    if duration <= timedelta(0):
        raise Refused(f"by-duration needs a positive duration, got {raw!r}.")
    return duration


@dataclass(frozen=True)
class PartitionMove:
    """One partition of a plan: where it is, where it goes, and what that means."""

    partition: int
    current: int | None        # None: no position yet (the pipeline/group never consumed it)
    new: int
    log_start: int
    high_watermark: int
    # How far the records were already delivered, where that is not `current`: an at-least-once pipeline
    # resumes from Kafka's committed offset, but may have written past it (a crash between its DB commit and
    # its Kafka commit), and what a rewind gives back or skips is counted from what was written.
    delivered: int | None = None

    @property
    def reprocess(self) -> int:
        """Records that will be read again (the new offset is behind the delivered position)."""
        done = self._done()
        return max(0, done - self.new) if done is not None else 0

    @property
    def skip(self) -> int:
        """Records that will never be read (the new offset is ahead of the delivered position)."""
        done = self._done()
        return max(0, self.new - done) if done is not None else 0

    def _done(self) -> int | None:
        return self.current if self.delivered is None else self.delivered

    def as_dict(self) -> dict:
        return {"partition": self.partition, "current": self.current, "new": self.new,
                "log_start": self.log_start, "high_watermark": self.high_watermark,
                "reprocess": self.reprocess, "skip": self.skip}


def choose_partitions(topic: str, requested: list[int] | None, cluster=None) -> list[int]:
    """The topic's partitions, or the requested ones after checking they exist."""
    try:
        existing = kafka_admin.partitions_for(topic, cluster=cluster)
    except (kafka_admin.KafkaUnreachable, KafkaError) as exc:  # Kafka cannot be used now (or went down since its
        raise as_refusal(exc) from None                          # check passed), or its settings are wrong
    except kafka_admin.KafkaAdminError as exc:
        raise Refused(str(exc)) from None
    if not requested:
        return existing
    unknown = sorted(set(requested) - set(existing))
    if unknown:
        raise Refused(f"Unknown partition(s) {', '.join(map(str, unknown))} of topic {topic!r}: "
                      f"it has partitions {', '.join(map(str, existing))}.")
    return sorted(set(requested))


def resolve_offsets(spec: OffsetSpec, topic: str, partitions: list[int], current: dict[int, int | None],
                    marks: dict[int, "kafka_admin.Watermarks"] | None = None, cluster=None,
                    delivered: dict[int, int] | None = None) -> list[PartitionMove]:
    """New offset per partition for `spec`; raise Refused if any target lies outside its partition's
    [log start, high watermark] or needs a current position the partition does not have. `delivered`: how far
    a partition's records were delivered where that is past `current` (PartitionMove.delivered)."""
    marks = marks or kafka_admin.watermarks(topic, partitions, cluster=cluster)
    by_time = {}
    if spec.moment is not None:
        by_time = kafka_admin.offsets_for_time(topic, partitions, int(spec.moment.timestamp() * 1000),
                                               cluster=cluster)
    moves, problems = [], []
    for p in partitions:
        mark, here = marks[p], current.get(p)
        if spec.mode == "to-earliest":
            new = mark.log_start
        elif spec.mode == "to-latest":
            new = mark.high
        elif spec.mode == "to-offset":
            new = spec.offset
        elif spec.mode in ("to-current", "shift-by"):
            if here is None:
                problems.append(f"partition {p} has no current position to {spec.mode.replace('-', ' ')}")
                continue
            new = here + (spec.offset if spec.mode == "shift-by" else 0)
        else:
            # No record at or after the moment: nothing to re-read, go to the end (as kafka-consumer-groups).
            new = by_time.get(p) if by_time.get(p) is not None else mark.high
        if not mark.log_start <= new <= mark.high:
            problems.append(f"partition {p}: offset {new} is outside [{mark.log_start}, {mark.high}] "
                            f"(log start, high watermark)")
            continue
        moves.append(PartitionMove(p, here, new, mark.log_start, mark.high, (delivered or {}).get(p)))
    if problems:
        raise Refused(f"{spec.describe()} refused: " + "; ".join(problems) + ". Nothing was changed.")
    return moves


def offsets_of(moves: list[PartitionMove], attribute: str) -> dict[str, int | None]:
    """{"0": n, ...} for the action log (JSON keys are strings)."""
    return {str(m.partition): getattr(m, attribute) for m in moves}
