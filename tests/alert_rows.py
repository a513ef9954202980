"""Alerts as evaluation leaves them, for the tests of the pages, the API and the admin that act on them."""
from django.utils import timezone

from alerts.models import OPEN_STATES, Alert, AlertRule, AlertState, RuleKind
from consumers.models import Pipeline, Watch


def open_alert(subject: Pipeline | Watch | str, *, state: str = AlertState.FIRING, kind: str = RuleKind.LOST,
               summary: str = "3 lost records (partition 0: offsets 1-3)") -> Alert:
    """An alert of a `kind` rule about `subject`: a pipeline (or the name of one, made if missing) under a rule of
    its own, or a watch under a rule for every pipeline and watch. A subject holds one open alert per rule, as the
    database keeps it: asked again, the open one is returned."""
    if isinstance(subject, str):
        subject = Pipeline.objects.get_or_create(name=subject, defaults={"topic": subject, "sink_table": subject})[0]
    pipeline = subject if isinstance(subject, Pipeline) else None
    watch = subject if isinstance(subject, Watch) else None
    name = f"{pipeline.name} {kind}" if pipeline else f"any {kind}"
    rule = AlertRule.objects.get_or_create(name=name, kind=kind, pipeline=pipeline)[0]
    if state in OPEN_STATES and (opened := Alert.objects.filter(rule=rule, pipeline=pipeline, watch=watch,
                                                                 state__in=OPEN_STATES).first()):
        return opened
    now = timezone.now()
    return Alert.objects.create(rule=rule, pipeline=pipeline, watch=watch, state=state, summary=summary,
                                facts={"count": 3}, started_at=now, last_seen_at=now,
                                resolved_at=now if state == AlertState.RESOLVED else None)
