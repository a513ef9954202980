"""Rule conditions: given what reconciliation (or a watch's check) stored for a pipeline or a watch, does a rule
fire, and with which facts?

Pure reads. Each check returns None (not firing) or a Finding with a one-line summary and the facts an
operator needs (partitions, offset ranges, counts, measured value and threshold).
"""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count

from alerts.models import AlertRule, RuleKind
from consumers.models import (
    ConsumerRun,
    DeadLetter,
    DesiredState,
    PartitionHealth,
    PipelineHealth,
)
from consumers.reconciliation.report import INCIDENT_KINDS
from consumers.reconciliation.rewinds import PipelineRewinds, effective_rewinds_of, rewinds_for, subtract_ranges

# Findings keep at most this many ranges per partition: an email listing 10,000 ranges helps nobody.
MAX_RANGES_PER_PARTITION = 20
FINDING_KINDS = ("lost", "duplicated", "phantom")


def rewind_grace() -> timedelta:
    return timedelta(seconds=getattr(settings, "ALERT_REWIND_GRACE_SECONDS", 600))


@dataclass
class Finding:
    summary: str
    facts: dict = field(default_factory=dict)


@dataclass
class PipelineView:
    """Everything the rules read about one pipeline, loaded once per evaluation."""

    pipeline: object
    health: PipelineHealth | None
    partitions: list[PartitionHealth]
    rewinds: PipelineRewinds
    now: datetime
    # Read for a whole pass by load_all (None: not read, the check asks the database itself):
    serving: bool | None = None                  # a run serves the pipeline now
    dead_letters: dict[int, int] | None = None   # {interval seconds: dead letters in the interval before now}

    @classmethod
    def load(cls, pipeline, now):
        health = PipelineHealth.objects.filter(pipeline=pipeline).first()
        partitions = list(PartitionHealth.objects.filter(pipeline=pipeline).order_by("partition"))
        return cls(pipeline, health, partitions, rewinds_for(pipeline), now)

    @classmethod
    def load_all(cls, pipelines, now, rules) -> dict[int, "PipelineView"]:
        """{pipeline id: view} of many pipelines in a few queries whatever their number (an alert pass), the same
        views as load() gives, plus what the run and dead-letter rules ask of each pipeline."""
        ids = [p.pk for p in pipelines]
        healths = {h.pipeline_id: h for h in PipelineHealth.objects.filter(pipeline_id__in=ids)}
        partitions: dict[int, list] = {}
        for part in PartitionHealth.objects.filter(pipeline_id__in=ids).order_by("pipeline_id", "partition"):
            partitions.setdefault(part.pipeline_id, []).append(part)
        rewinds = effective_rewinds_of(ids)
        serving = set(ConsumerRun.objects.filter(pipeline_id__in=ids).serving(now).values_list("pipeline_id",
                                                                                                flat=True))
        dead_letters: dict[int, dict[int, int]] = {pk: {} for pk in ids}
        for interval in {r.interval_seconds for r in rules if r.kind == RuleKind.DEAD_LETTERS}:
            counts = dict(_dead_letters(now, interval).filter(pipeline_id__in=ids).values("pipeline_id")
                          .annotate(n=Count("pk")).values_list("pipeline_id", "n"))
            for pk in ids:
                dead_letters[pk][interval] = counts.get(pk, 0)
        return {p.pk: cls(p, healths.get(p.pk), partitions.get(p.pk, []), rewinds_for(p, rewinds.get(p.pk, [])),
                          now, serving=p.pk in serving, dead_letters=dead_letters[p.pk]) for p in pipelines}

    @property
    def checked_at(self):
        return self.health.checked_at.isoformat() if self.health else None

    def recently_rewound(self) -> bool:
        return self.rewinds.latest_at is not None and self.now - self.rewinds.latest_at < rewind_grace()


class _NoRewinds:
    """A watch's group is reset by its team, not by Tally: no planned ranges, no replays."""

    latest_at = None

    def planned_ranges(self, partition, next_offset):
        return []

    def replay_end(self, partition, position):
        return None


@dataclass
class _WatchPartition:
    """A watch partition as the rules read a pipeline's PartitionHealth: its committed offset as the position,
    its ranges' findings as offset ranges."""

    partition: int
    next_offset: int | None
    high_watermark: int | None
    lag_records: int | None
    lag_seconds: float | None
    status: str
    lost: int
    duplicated: int
    phantom: int
    findings: list


@dataclass
class _WatchSubject:
    """What check_status reads of a pipeline: a watch is always meant to run (its team runs it)."""

    name: str
    last_error: str
    desired_state: str = DesiredState.RUNNING


@dataclass
class WatchView(PipelineView):
    """The rules' view of a watch: the same checks read it as they read a pipeline."""

    @classmethod
    def load(cls, watch, now, ranges=None, partitions=None):
        """`ranges` (its first MAX_RANGES_PER_PARTITION WatchRanges with findings per partition) and `partitions`
        (its WatchPartitions) when already read (load_all), else read now."""
        from consumers.reconciliation.watch_listing import first_finding_ranges

        if ranges is None:
            ranges = first_finding_ranges([watch.pk], MAX_RANGES_PER_PARTITION).get(watch.pk, [])
        if partitions is None:
            partitions = watch.partitions.all()
        read: dict[int, list] = {}
        for r in ranges:
            read.setdefault(r.partition, []).append(r)
        partitions = [_WatchPartition(p.partition, p.committed, p.high_watermark, p.lag_records, p.lag_seconds,
                                      p.status, p.lost, p.duplicated, p.phantom, _partition_findings(p, read))
                      for p in sorted(partitions, key=lambda p: p.partition)]
        health = watch if watch.checked_at else None
        return cls(_WatchSubject(watch.name, watch.last_error), health, partitions, _NoRewinds(), now)

    @classmethod
    def load_all(cls, watches, now) -> dict[int, "WatchView"]:
        """{watch id: view} of many watches in two queries whatever their number (an alert pass)."""
        from consumers.models import WatchPartition
        from consumers.reconciliation.watch_listing import first_finding_ranges

        ids = [w.pk for w in watches]
        ranges = first_finding_ranges(ids, MAX_RANGES_PER_PARTITION)
        partitions: dict[int, list] = {}
        for p in WatchPartition.objects.filter(watch_id__in=ids):
            partitions.setdefault(p.watch_id, []).append(p)
        return {w.pk: cls.load(w, now, ranges.get(w.pk, []), partitions.get(w.pk, [])) for w in watches}


def _partition_findings(p, read: dict[int, list]) -> list[dict]:
    """The findings of watch partition `p` from its ranges `read`; when they were as many as were read, what its
    totals count beyond them folds into one range from the last read to the settled offset."""
    ranges = read.get(p.partition, [])
    findings = [f for r in ranges for kind in FINDING_KINDS if getattr(r, kind) for f in _watch_findings(r, kind)]
    if len(ranges) == MAX_RANGES_PER_PARTITION:
        for kind in FINDING_KINDS:
            left = getattr(p, kind) - sum(getattr(r, kind) for r in ranges)
            if left > 0:
                findings.append({"kind": kind, "start": ranges[-1].end, "end": max(p.settled_offset, ranges[-1].end),
                                 "count": left, "folded": True})
    return findings


def _watch_findings(r, kind: str) -> list[dict]:
    """A range's listed offsets of one kind as runs of consecutive offsets (what an email can name), and what
    the list left out folded into the rest of the range."""
    listed = sorted(o[0] if kind == "duplicated" else o for o in getattr(r, f"{kind}_offsets"))
    extra = {o[0]: o[1] for o in r.duplicated_offsets} if kind == "duplicated" else {}
    findings = []
    for offset in listed:
        if findings and findings[-1]["end"] == offset:
            findings[-1]["end"] += 1
        else:
            findings.append({"kind": kind, "start": offset, "end": offset + 1, "count": 0, "offsets": []})
        findings[-1]["count"] += extra.get(offset, 1)
        findings[-1]["offsets"].append(offset)
    left = getattr(r, kind) - sum(f["count"] for f in findings)
    if left > 0:
        start = listed[-1] + 1 if listed else r.start
        findings.append({"kind": kind, "start": start, "end": r.end, "count": left, "folded": True})
    return findings


def _format_range(start: int, end: int, folded: bool = False) -> str:
    text = str(start) if end - start == 1 else f"{start}-{end - 1}"
    # Reconciliation folds its findings beyond the first few into one covering range.
    return f"within {text}" if folded else text


def _offset_findings(view: PipelineView, kinds: tuple[str, ...], count_field: str | None, label: tuple[str, str],
                     planned_exempt: bool) -> Finding | None:
    """Findings of the given kinds per partition, minus rewound ranges when `planned_exempt`; `label` is what
    one of them is called, and several."""
    per_partition, total = {}, 0
    for part in view.partitions:
        pieces, count, samples = [], 0, []
        typed = [f for f in (part.findings or []) if isinstance(f, dict) and f.get("kind") in kinds]
        planned = view.rewinds.planned_ranges(part.partition, part.next_offset) if planned_exempt else []
        for finding in typed:
            start, end = finding.get("start"), finding.get("end")
            if start is None or end is None:
                count += int(finding.get("count") or 0)
                continue
            start, end = int(start), int(end)
            kept = subtract_ranges(start, end, planned)
            kept_size = sum(e - s for s, e in kept)
            reported = int(finding.get("count") or (end - start))
            # A range may hold fewer (folded) or more (duplicates) records than offsets: scale by what stays.
            count += reported if kept_size == end - start else round(reported * kept_size / max(end - start, 1))
            pieces.extend((s, e, bool(finding.get("folded"))) for s, e in kept)
            samples.extend(o for o in finding.get("offsets") or [] if any(s <= o < e for s, e in kept))
        if not typed and count_field and getattr(part, count_field, 0) and not planned:
            count = int(getattr(part, count_field))
        if count > 0:
            pieces.sort()
            shown = pieces[:MAX_RANGES_PER_PARTITION]
            text = ", ".join(_format_range(*piece) for piece in shown)
            per_partition[str(part.partition)] = {
                "count": count, "ranges": [[s, e] for s, e, _ in shown],
                "ranges_truncated": len(pieces) > MAX_RANGES_PER_PARTITION,
                "offsets_text": text + (", ..." if len(pieces) > MAX_RANGES_PER_PARTITION else ""),
                "sample_offsets": samples[:20]}
            total += count
    if not view.partitions and count_field and view.health and getattr(view.health, count_field, 0):
        total = int(getattr(view.health, count_field))
    if total <= 0:
        return None
    where = "; ".join(f"partition {p}: offsets {info['offsets_text']}" if info["offsets_text"] else f"partition {p}"
                      for p, info in per_partition.items())
    summary = f"{total} {label[total != 1]}" + (f" ({where})" if where else "")
    if len(summary) > 300:
        summary = summary[:296] + " ..."
    return Finding(summary, {"count": total, "partitions": per_partition, "checked_at": view.checked_at})


def check_lost(rule, view):
    # Unrecoverable records (below the log start before anyone read them) are lost too.
    return _offset_findings(view, ("lost", "unrecoverable"), "lost", ("lost record", "lost records"),
                            planned_exempt=True)


def check_gap(rule, view):
    return _offset_findings(view, ("gap",), None, ("offset in a ledger gap", "offsets in ledger gaps"),
                            planned_exempt=True)


def check_duplicated(rule, view):
    # The same count as reconciliation's "duplicated" (extra sink rows). A ledger overlap covers the same
    # records again: counting it too would double them; it alerts on its own only when no row is duplicated.
    return (_offset_findings(view, ("duplicated",), "duplicated", ("duplicated record", "duplicated records"),
                             planned_exempt=False)
            or _offset_findings(view, ("overlap",), None,
                                ("offset in overlapping ledger batches", "offsets in overlapping ledger batches"),
                                planned_exempt=False))


def check_phantom(rule, view):
    return _offset_findings(view, ("phantom",), "phantom", ("phantom row", "phantom rows"), planned_exempt=False)


def _threshold(rule) -> float:
    return rule.threshold if rule.threshold is not None else 0.0


def check_lag_records(rule, view):
    """Lag in records, not counting a rewound range that is being replayed (planned, not behind)."""
    per_partition, total = {}, 0
    for part in view.partitions:
        if part.lag_records is None:
            continue
        lag = part.lag_records
        replay_end = view.rewinds.replay_end(part.partition, part.next_offset)
        if replay_end is not None:
            lag = max(0, lag - (replay_end - part.next_offset))
        per_partition[str(part.partition)] = {"lag_records": lag, "next_offset": part.next_offset,
                                              "high_watermark": part.high_watermark}
        total += lag
    if not view.partitions:
        if not view.health or view.health.lag_records is None:
            return None
        total = view.health.lag_records
    if total <= _threshold(rule):
        return None
    return Finding(f"lag {total} records > {_threshold(rule):g}",
                   {"value": total, "threshold": _threshold(rule), "partitions": per_partition,
                    "checked_at": view.checked_at})


def check_lag_seconds(rule, view):
    worst, per_partition = None, {}
    for part in view.partitions:
        if part.lag_seconds is None or view.rewinds.replay_end(part.partition, part.next_offset) is not None:
            continue
        per_partition[str(part.partition)] = {"lag_seconds": round(part.lag_seconds, 1),
                                              "next_offset": part.next_offset}
        worst = part.lag_seconds if worst is None else max(worst, part.lag_seconds)
    if not view.partitions and view.health:
        worst = view.health.lag_seconds
    if worst is None or worst <= _threshold(rule):
        return None
    return Finding(f"lag {worst:.0f} s > {_threshold(rule):g} s",
                   {"value": round(worst, 1), "threshold": _threshold(rule), "partitions": per_partition,
                    "checked_at": view.checked_at})


STALL_LIKE = {"STALL", "STOP", "REWIND"}


def _has_incident(part) -> bool:
    # Incident findings have their own rules (lost, duplicated, ...): the status rule does not send a second
    # email for the same incident.
    return any(isinstance(f, dict) and f.get("kind") in INCIDENT_KINDS for f in part.findings or [])


def _status_fires(status: str, wanted: set[str], planned: bool, incident: bool) -> bool:
    if status not in wanted:
        return False
    if status in STALL_LIKE and planned:
        return False
    return not (status == "ERR" and incident)


def check_status(rule, view):
    """STALL/STOP after a rewind, or of a pipeline an operator paused or stopped, are planned: no alert.
    ERR caused by findings is left to the finding rules; ERR for other reasons (Kafka unreadable) fires."""
    if not view.health:
        return None
    wanted = rule.status_set()
    planned = view.pipeline.desired_state != DesiredState.RUNNING or view.recently_rewound()
    bad = {}
    for part in view.partitions:
        if _status_fires(part.status, wanted, planned, _has_incident(part)):
            bad[str(part.partition)] = {"status": part.status, "next_offset": part.next_offset,
                                        "lag_records": part.lag_records}
    status = view.health.status
    if view.partitions:
        if not bad:
            return None
        shown = ",".join(sorted({p["status"] for p in bad.values()}))
    else:
        if not _status_fires(status, wanted, planned, incident=bool(view.health.lost or view.health.duplicated
                                                                     or view.health.phantom)):
            return None
        shown = status
    where = f" (partitions {', '.join(bad)})" if bad else ""
    # An ERR without findings has its reason in the pipeline's last error (a broken sink, a failed run).
    reason = view.pipeline.last_error if "ERR" in shown and view.pipeline.last_error else ""
    return Finding(f"status {shown}{where}" + (f": {reason}" if reason else ""),
                   {"status": status, "partitions": bad, "checked_at": view.checked_at, "reason": reason or None})


def _dead_letters(now, interval_seconds: int):
    return DeadLetter.objects.filter(created_at__gt=now - timedelta(seconds=interval_seconds), created_at__lte=now)


def check_dead_letters(rule, view):
    counted = (view.dead_letters or {}).get(rule.interval_seconds)
    if counted is not None and counted <= _threshold(rule):
        return None   # counted for the whole pass (PipelineView.load_all): nothing to list
    letters = _dead_letters(view.now, rule.interval_seconds).filter(pipeline=view.pipeline)
    count = letters.count()
    if count <= _threshold(rule):
        return None
    per_partition = {}
    for letter in letters.order_by("partition", "offset")[:200]:
        per_partition.setdefault(str(letter.partition), []).append(letter.offset)
    partitions = {p: {"count": len(o), "sample_offsets": o[:20], "offsets_text": ", ".join(map(str, o[:20]))}
                  for p, o in per_partition.items()}
    letters_text = f"{count} dead letter{'' if count == 1 else 's'}"
    return Finding(f"{letters_text} in {rule.interval_seconds} s > {_threshold(rule):g}",
                   {"count": count, "value": count, "threshold": _threshold(rule),
                    "interval_seconds": rule.interval_seconds, "partitions": partitions})


def check_no_consumer(rule, view):
    if view.pipeline.desired_state != DesiredState.RUNNING:
        return None
    runs = ConsumerRun.objects.filter(pipeline=view.pipeline)
    if view.serving if view.serving is not None else runs.serving(view.now).exists():
        return None
    last = runs.order_by("-started_at", "-pk").first()
    facts = {"desired_state": view.pipeline.desired_state,
             "last_heartbeat_at": last.heartbeat_at.isoformat() if last else None,
             "last_run_state": last.state if last else None,
             "last_end_reason": (last.end_reason[:200] if last else "")}
    if view.pipeline.waiting_for_worker(view.now):
        # Its run tasks wait in the queue: every worker is full (or none runs). Say so, not "no consumer".
        facts["runs_waiting"] = view.pipeline.runs_waiting
        return Finding(f"should run but is waiting for a worker: {view.pipeline.runs_waiting} run task(s) queued "
                       f"since {view.pipeline.waiting_since:%Y-%m-%d %H:%M:%S} UTC; add a worker", facts)
    halted = view.pipeline.halted_run()
    if halted is not None:
        # Halted on a bad record or a database error: say why, the supervisor will not restart it.
        return Finding(f"should run but halted: {halted.end_reason[:270]}", facts)
    when = f"last heartbeat {last.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC" if last else "never started"
    return Finding(f"should run but has no live consumer ({when})", facts)


CHECKS = {
    RuleKind.LOST: check_lost, RuleKind.GAP: check_gap, RuleKind.DUPLICATED: check_duplicated,
    RuleKind.PHANTOM: check_phantom, RuleKind.LAG_RECORDS: check_lag_records,
    RuleKind.LAG_SECONDS: check_lag_seconds, RuleKind.STATUS: check_status,
    RuleKind.DEAD_LETTERS: check_dead_letters, RuleKind.NO_CONSUMER: check_no_consumer,
}


def check(rule: AlertRule, view: PipelineView) -> Finding | None:
    return CHECKS[rule.kind](rule, view)


# What a watch can alert on: the kinds its check measures (no ledger gaps, dead letters or runs of Tally's).
WATCH_KINDS = {RuleKind.LOST, RuleKind.DUPLICATED, RuleKind.PHANTOM, RuleKind.LAG_RECORDS, RuleKind.LAG_SECONDS,
               RuleKind.STATUS}


def rules_for_watch(all_rules: list[AlertRule]) -> list[AlertRule]:
    """Global rules of the kinds a watch has; enabled ones only."""
    return [r for r in all_rules if r.pipeline_id is None and r.kind in WATCH_KINDS and r.enabled]


def rules_for(pipeline, all_rules: list[AlertRule]) -> list[AlertRule]:
    """The pipeline's own rules, plus global rules of kinds it has no own rule for; enabled ones only."""
    own = [r for r in all_rules if r.pipeline_id == pipeline.pk]
    own_kinds = {r.kind for r in own}
    chosen = own + [r for r in all_rules if r.pipeline_id is None and r.kind not in own_kinds]
    return [r for r in chosen if r.enabled]
