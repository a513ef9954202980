"""History survives deletions: before a pipeline, a watch or an alert rule is deleted, its alerts still open are
resolved (with their "resolved" email, if a "fired" one went out) and every alert of it keeps the names it was about.
The database then empties the links (SET_NULL); the alerts and their emails stay. A channel routed to a deleted
rule alone is disabled, not widened to every rule."""
from django.db.models.signals import pre_delete
from django.dispatch import receiver

from alerts import channel_actions, evaluate
from alerts.models import Alert, AlertRule, Channel
from consumers.models import Pipeline, Watch


@receiver(pre_delete, sender=Pipeline, dispatch_uid="alerts-keep-pipeline-history")
def keep_pipeline_history(sender, instance, **kwargs):
    evaluate.resolve_gone(Alert.objects.filter(pipeline=instance), f"pipeline {instance.name} deleted")
    Alert.objects.filter(pipeline=instance).update(pipeline_name=instance.name)


@receiver(pre_delete, sender=AlertRule, dispatch_uid="alerts-keep-rule-history")
def keep_rule_history(sender, instance, **kwargs):
    evaluate.resolve_gone(Alert.objects.filter(rule=instance), f"rule {instance.name!r} deleted")
    Alert.objects.filter(rule=instance).update(rule_name=instance.name, rule_kind=instance.kind)
    disable_channels_routed_only_to(instance)


def disable_channels_routed_only_to(rule: AlertRule) -> None:
    """A channel without rules hears every rule: one whose only rule goes (deleted, or with its pipeline) would
    start paging for everything. It is disabled instead, in the action log; an operator re-routes it."""
    for channel in Channel.objects.filter(rules=rule, enabled=True).prefetch_related("rules"):
        if {r.pk for r in channel.rules.all()} == {rule.pk}:
            channel.enabled = False
            channel.save(update_fields=["enabled"])
            channel_actions.log("alert_channel_change", "tally", channel,
                                f"alert channel {channel.name!r} disabled: its only rule {rule.name!r} was deleted "
                                f"(a channel without rules would receive every rule's notifications)")


@receiver(pre_delete, sender=Watch, dispatch_uid="alerts-keep-watch-history")
def keep_watch_history(sender, instance, **kwargs):
    evaluate.resolve_gone(Alert.objects.filter(watch=instance), f"watch {instance.name} deleted")
    Alert.objects.filter(watch=instance).update(pipeline_name=instance.name)
