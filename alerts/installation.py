"""This installation's key (alerts.models.Installation), which every PagerDuty dedup_key and webhook id names.
A database copied for staging or a test keeps production's key, and its alert ids go on from production's: once
its alerts fire, its incidents would fold into production's, and its resolves close them. `new_key` gives the
copy a key of its own (`manage.py installation new-key`), and can disable the channels it copied, so that the
copy stops sending to production's receivers at all. Audited."""
import uuid
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from alerts.models import OPEN_STATES, Alert, Channel, Installation
from consumers.models import ActionLog, ActionResult


@dataclass(frozen=True)
class NewKey:
    old: str
    new: str
    open_alerts: int              # their next messages name the new key: they no longer reach the old incidents
    disabled: tuple[str, ...]     # the channels disabled (names)


def new_key(actor: str, *, disable_channels: bool = False) -> NewKey:
    with transaction.atomic():
        installation = Installation.objects.select_for_update().filter(pk=Installation.ONE).first()
        installation = installation or Installation.current()
        old = installation.key.hex
        installation.key = uuid.uuid4()
        installation.save(update_fields=["key"])
        disabled = ()
        if disable_channels:
            enabled = Channel.objects.select_for_update().filter(enabled=True)
            disabled = tuple(enabled.values_list("name", flat=True))
            Channel.objects.filter(name__in=disabled).update(enabled=False)
        open_alerts = Alert.objects.filter(state__in=OPEN_STATES)
        # An open alert whose incident was opened before keys named the installation speaks for it no more either
        open_alerts.exclude(legacy_dedup_key="").update(legacy_dedup_key="")
        done = NewKey(old, installation.key.hex, open_alerts.count(), disabled)
        now = timezone.now()
        ActionLog.objects.create(
            action="installation_new_key", actor=actor[:150], result=ActionResult.DONE, created_at=now,
            finished_at=now, params={"old_key": done.old, "new_key": done.new, "disabled_channels": list(disabled)},
            message=summary(done))
    return done


def summary(done: NewKey) -> str:
    said = f"installation key {done.old} replaced by {done.new}"
    if done.open_alerts:
        said += (f"; the next messages of {done.open_alerts} open alert(s) name the new key, so they no longer "
                 "update or resolve the incidents opened under the old one")
    if done.disabled:
        said += f"; disabled alert channel(s): {', '.join(done.disabled)}"
    return said
