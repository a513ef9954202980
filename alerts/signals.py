"""History survives deletions: before a pipeline, a watch or an alert rule is deleted, its alerts still open are
resolved (with their "resolved" email, if a "fired" one went out) and every alert of it keeps the names it was about.
The database then empties the links (SET_NULL); the alerts and their emails stay. A channel routed to a deleted
rule alone (or rules deleted together) is disabled, not widened to every rule."""
from django.db.models import Count
from django.db.models.signals import post_delete, pre_delete
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
    # Read before the delete, judged after it: rules deleted together (a pipeline's own, a queryset's) each still
    # see the others here.
    routed = Channel.objects.filter(rules=instance, enabled=True).values("pk")
    instance.routed_channels = dict(Channel.objects.filter(pk__in=routed).annotate(rule_count=Count("rules"))
                                    .values_list("pk", "rule_count"))


@receiver(post_delete, sender=AlertRule, dispatch_uid="alerts-disable-channels-left-without-rules")
def disable_channels_left_without_rules(sender, instance, **kwargs):
    """A channel without rules hears every rule: one whose rules all go (deleted, or with their pipeline) would
    start paging for everything. It is disabled instead, in the action log; an operator re-routes it."""
    routed = getattr(instance, "routed_channels", {})
    for channel in Channel.objects.filter(pk__in=routed, enabled=True, rules=None):
        channel.enabled = False
        channel.save(update_fields=["enabled"])
        gone = (f"its only rule {instance.name!r} was deleted" if routed[channel.pk] == 1 else
                f"its {routed[channel.pk]} rules were deleted together, {instance.name!r} among them")
        channel_actions.log("alert_channel_change", "tally", channel,
                            f"alert channel {channel.name!r} disabled: {gone} (a channel without rules would "
                            f"receive every rule's notifications)")


@receiver(pre_delete, sender=Watch, dispatch_uid="alerts-keep-watch-history")
def keep_watch_history(sender, instance, **kwargs):
    evaluate.resolve_gone(Alert.objects.filter(watch=instance), f"watch {instance.name} deleted")
    Alert.objects.filter(watch=instance).update(pipeline_name=instance.name)
