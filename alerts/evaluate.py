"""Evaluation: turn rule checks into alert state changes and outbox messages. Idempotent and stored.

For each pipeline and each rule that applies to it (`rules.rules_for`), then each watch and the global rules of
the kinds a watch measures (`rules.rules_for_watch`), in one transaction holding the open alert's row lock:
  - firing and no open alert   -> create it (the partial unique index stops a concurrent twin) and queue
                                  the "fired" message (the rule's recipients and its channels: alerts/outbox.py);
  - firing and open            -> refresh its facts; queue "fired" for channels routed to it since it fired
                                  (`outbox.queue_for_new_channels`); queue a reminder when `next_reminder_at` is
                                  due (firing only: acknowledging stops reminders);
  - not firing and open        -> resolve it and queue the "resolved" message (if a "fired" one went out);
  - open, but its rule was edited to another kind -> resolve it as above, then treat the rule as having
                                  no open alert (what it finds now is a new incident, with its own dedup_key).
Open alerts no rule applies to any more (disabled, overridden, their pipeline, watch or rule deleted) are resolved.
A mute holds the "fired" message and the reminders of its rule for its pipeline or watch, and the "resolved" email;
channels that heard an alert fire still hear it resolve. An alert that fired while muted gets its "fired" message
when the mute ends, if it still fires. An operator's acknowledge (`acknowledge`) tells the channels that heard it
fire and whose kind has a word for it (`outbox.queue_acknowledged`). Running evaluation twice at the same `now`
changes nothing.
"""
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from alerts import outbox
from alerts.models import OPEN_STATES, Alert, AlertRule, AlertState, Mute, NotificationKind
from alerts.rules import Finding, PipelineView, WatchView, check, rules_for, rules_for_watch
from consumers.models import ActionLog, ActionResult, Pipeline, Watch

logger = logging.getLogger("tally.alerts")


@dataclass
class EvaluationReport:
    now: str = ""
    pipelines: int = 0
    watches: int = 0
    checks: int = 0
    fired: list = field(default_factory=list)
    reminded: list = field(default_factory=list)
    resolved: list = field(default_factory=list)
    muted: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    firing: list = field(default_factory=list)

    def as_json(self) -> dict:
        return dict(self.__dict__)


class AlertGone(ValueError):
    """The alert's rule or pipeline was deleted: the alert is history, there is nothing to mute."""


def _label(rule, pipeline) -> str:
    return f"{pipeline.name}/{rule.name}"


def _next_reminder(rule, after, now):
    """The first reminder time after `now` on the schedule `after + k * interval` (no bursts after downtime)."""
    if not rule.reminder_seconds:
        return None
    interval = timedelta(seconds=rule.reminder_seconds)
    due = after + interval
    if due <= now:
        due += interval * ((now - due) // interval + 1)
    return due


def _about(subject) -> dict:
    """The alert's link to what it is about: a pipeline, or a watch (a consumer group Tally does not run)."""
    return {"watch": subject, "pipeline": None} if isinstance(subject, Watch) else {"pipeline": subject}


def apply(rule: AlertRule, pipeline, finding: Finding | None, now, report: EvaluationReport) -> None:
    """`pipeline`: the pipeline or the watch the rule was checked on."""
    about = _about(pipeline)
    with transaction.atomic():
        alert = (Alert.objects.select_for_update(of=("self",)).select_related("rule", "pipeline", "watch")
                 .filter(rule=rule, **about, state__in=OPEN_STATES).first())
        muted = Mute.active_for(rule, **about, now=now).exists()
        if alert is not None and alert.rule_kind and alert.rule_kind != rule.kind:
            # The rule was edited to watch something else: the incident it opened is over (said so, and resolved
            # where it was told), and what the rule finds now is a new one, told as fired.
            alert.facts = {**(alert.facts or {}),
                           "resolved_because": f"rule {rule.name!r} changed from {alert.rule_kind} to {rule.kind}"}
            Alert.objects.filter(pk=alert.pk).update(facts=alert.facts)
            _resolve(alert, now, muted, report)
            alert = None
        if finding is None:
            if alert is not None:
                _resolve(alert, now, muted, report)
            return
        if alert is None:
            try:
                with transaction.atomic():
                    alert = Alert.objects.create(rule=rule, **about, state=AlertState.FIRING,
                                                 summary=finding.summary[:300], facts=finding.facts,
                                                 started_at=now, last_seen_at=now)
            except IntegrityError:
                return  # a concurrent evaluation opened it first; that one queues the email
        else:
            alert.summary, alert.facts, alert.last_seen_at = finding.summary[:300], finding.facts, now
        # "pipeline" names the subject, a watch's too (as the API's alerts do); "kind" tells which it is.
        report.firing.append({"alert": alert.pk, "kind": "watch" if isinstance(pipeline, Watch) else "pipeline",
                              "pipeline": pipeline.name, "rule": rule.name,
                              "state": alert.state, "summary": alert.summary})
        if muted:
            report.muted.append(_label(rule, pipeline))
        elif alert.notified_at is None:
            if outbox.queue(alert, NotificationKind.FIRED, 0, now):
                report.fired.append(_label(rule, pipeline))
                if alert.state == AlertState.ACKNOWLEDGED:
                    # Acknowledged while muted, when no channel had heard it fire: the acknowledge follows the
                    # fired, or PagerDuty would page for an alert someone has already taken.
                    outbox.queue_acknowledged(alert, now)
            alert.notified_at = now
            alert.next_reminder_at = _next_reminder(rule, now, now)
        elif alert.state == AlertState.FIRING and outbox.queue_for_new_channels(alert, now):
            report.fired.append(_label(rule, pipeline) + " (to channels added since it fired)")
        if (not muted and alert.state == AlertState.FIRING and alert.next_reminder_at
                and now >= alert.next_reminder_at):
            sequence = alert.reminders_sent + 1
            if outbox.queue(alert, NotificationKind.REMINDER, sequence, now):
                report.reminded.append(_label(rule, pipeline))
            alert.reminders_sent = sequence
            alert.next_reminder_at = _next_reminder(rule, alert.next_reminder_at, now)
        # Only the fields evaluation owns: an operator's acknowledge (a conditional UPDATE) is never undone.
        alert.save(update_fields=["summary", "facts", "last_seen_at", "notified_at", "next_reminder_at",
                                  "reminders_sent"])


def _resolve(alert: Alert, now, muted: bool, report: EvaluationReport) -> None:
    changed = Alert.objects.filter(pk=alert.pk, state__in=OPEN_STATES).update(
        state=AlertState.RESOLVED, resolved_at=now, next_reminder_at=None)
    if not changed:
        return
    alert.state, alert.resolved_at = AlertState.RESOLVED, now
    report.resolved.append(f"{alert.pipeline_label}/{alert.rule_label}")
    # Recipients who never heard of it (it fired while muted) get no "resolved" email either. A mute holds the
    # "resolved" email, but channels that heard it fire hear it resolve (an incident they opened is closed).
    if alert.notified_at is not None and not alert.is_gone:
        outbox.queue(alert, NotificationKind.RESOLVED, 0, now, email=not muted)


def resolve_gone(alerts, reason: str, now=None) -> list[str]:
    """Resolve the open alerts among `alerts` (a queryset) because their pipeline, watch or rule is going away: each
    keeps `reason` in its facts and gets its "resolved" email as evaluation would send it."""
    now = now or timezone.now()
    report = EvaluationReport(now=now.isoformat())
    with transaction.atomic():
        locked = alerts.select_for_update(of=("self",)).select_related("rule", "pipeline")
        for alert in locked.filter(state__in=OPEN_STATES):
            alert.facts = {**(alert.facts or {}), "resolved_because": reason}
            Alert.objects.filter(pk=alert.pk).update(facts=alert.facts)
            muted = not alert.is_gone and alert.active_mute(now) is not None
            _resolve(alert, now, muted, report)
    return report.resolved


def evaluate_all(now=None) -> EvaluationReport:
    """Evaluate every rule for every pipeline and watch once. A failing check is recorded and skipped, never fatal."""
    now = now or timezone.now()
    report = EvaluationReport(now=now.isoformat())
    all_rules = list(AlertRule.objects.select_related("pipeline"))
    # Healthy pipelines without an open alert need no transaction at all: most of them, most of the time.
    open_pairs = set(Alert.objects.filter(state__in=OPEN_STATES).values_list("rule_id", "pipeline_id", "watch_id"))
    evaluated = set()
    pipelines = list(Pipeline.objects.order_by("name"))
    views = _views(PipelineView.load_all, pipelines, now, all_rules)
    for pipeline in pipelines:
        _evaluate_subject(pipeline, PipelineView, rules_for(pipeline, all_rules), open_pairs, evaluated, now, report,
                          views.get(pipeline.pk))
    # Watches go through the same rules (the global ones of the kinds a watch measures) and the same apply().
    watch_rules = rules_for_watch(all_rules)
    watches = list(Watch.objects.order_by("name"))
    views = _views(WatchView.load_all, watches, now)
    for watch in watches:
        _evaluate_subject(watch, WatchView, watch_rules, open_pairs, evaluated, now, report, views.get(watch.pk))
    # Open alerts of rules that no longer apply (disabled, overridden, deleted pipeline rule): resolve them.
    for alert in Alert.objects.filter(state__in=OPEN_STATES).select_related("rule", "pipeline", "watch"):
        if alert.is_gone:  # deleted without the ORM's signals (raw SQL): resolved, never matched by rule and pipeline
            report.resolved += resolve_gone(Alert.objects.filter(pk=alert.pk), "rule or pipeline deleted", now)
        elif (alert.rule_id, alert.pipeline_id, alert.watch_id) not in evaluated:
            apply(alert.rule, alert.subject, None, now, report)
    return report


def _views(load_all, subjects, now, *rules) -> dict:
    """What the rules read of every pipeline (or watch), in a few queries for the whole pass rather than several
    per pipeline. Should that fail, {}: each is then loaded alone, so one broken row fails only its own checks."""
    try:
        return load_all(subjects, now, *rules)
    except Exception:  # noqa: BLE001 - the loads one by one report what is wrong, and where
        logger.exception("alerts: loading every view at once failed; loading them one by one")
        return {}


def _evaluate_subject(subject: Pipeline | Watch, view_class, rules: list[AlertRule], open_pairs, evaluated, now,
                      report: EvaluationReport, view=None) -> None:
    """One pipeline or watch through its rules (`view`: what they read of it, when the pass read it already). A
    failing load or check is recorded and skipped, never fatal."""
    noun = "watch" if isinstance(subject, Watch) else "pipeline"
    where = f"watch {subject.name}" if noun == "watch" else subject.name
    key = (None, subject.pk) if noun == "watch" else (subject.pk, None)
    if noun == "watch":
        report.watches += 1
    else:
        report.pipelines += 1
    try:
        view = view or view_class.load(subject, now)
    except Exception as error:  # noqa: BLE001 - one broken pipeline or watch must not silence the others
        logger.exception("alerts: cannot load %s", where)
        report.errors.append({noun: subject.name, "error": str(error)})
        # Not read is not healthy: its open alerts stay open (the pass's last loop resolves only those not evaluated).
        evaluated.update((rule.pk, *key) for rule in rules)
        return
    for rule in rules:
        evaluated.add((rule.pk, *key))
        report.checks += 1
        try:
            finding = check(rule, view)
            if finding is None and (rule.pk, *key) not in open_pairs:
                continue
            apply(rule, subject, finding, now, report)
        except Exception as error:  # noqa: BLE001
            logger.exception("alerts: rule %s on %s failed", rule.name, where)
            report.errors.append({noun: subject.name, "rule": rule.name, "error": str(error)})


def acknowledge(alert: Alert, user: str, now=None) -> bool:
    """firing -> acknowledged, in the operators' action log with the actor; the channels that heard it fire are
    told in the same transaction (alerts.outbox.queue_acknowledged)."""
    now = now or timezone.now()
    with transaction.atomic():
        changed = alert.acknowledge(user, now)
        if changed:
            outbox.queue_acknowledged(alert, now)
    if changed:
        _log_action(alert, "acknowledge_alert", user, {}, f"acknowledged alert {alert.pk}: {alert.summary}", now)
    else:
        _log_action(alert, "acknowledge_alert", user, {}, f"alert {alert.pk} is {alert.state}, not firing: "
                    "nothing to acknowledge", now, result=ActionResult.REFUSED)
    return changed


def mute(alert: Alert, minutes: int, user: str, reason: str = "", now=None) -> Mute:
    """Mute the alert's rule for its pipeline or its watch for `minutes`, in the operators' action log with the
    actor. Raises AlertGone for an alert whose rule, pipeline or watch was deleted (an empty link would mute
    everything)."""
    if alert.is_gone:
        gone = "rule" if alert.rule_id is None else "pipeline or watch"
        refusal = AlertGone(f"Alert {alert.pk} is history: its {gone} was deleted, so there is nothing to mute.")
        _log_action(alert, "mute_alert", user, {"minutes": minutes}, str(refusal), now, result=ActionResult.REFUSED)
        raise refusal
    muted = Mute.mute(rule=alert.rule, pipeline=alert.pipeline, watch=alert.watch, minutes=minutes, user=user,
                      reason=reason, now=now)
    _log_action(alert, "mute_alert", user, {"minutes": minutes, "reason": reason[:200]},
                f"muted rule {alert.rule.name!r} on {muted.scope_label} until {muted.until:%Y-%m-%d %H:%M} UTC", now)
    return muted


def _log_action(alert: Alert, action: str, user: str, params: dict, message: str, now=None,
                result: str = ActionResult.DONE) -> None:
    now = now or timezone.now()
    ActionLog.objects.create(pipeline=alert.pipeline, action=action, actor=user[:150],
                             params={"alert": alert.pk, "rule": alert.rule_label, **params}, result=result,
                             message=message, created_at=now, finished_at=now)
