"""What the alerts API answers, declared for the OpenAPI schema (as dashboard/api/schemas.py for the rest of the
API; tests/test_api_responses.py checks real answers against both)."""
from rest_framework import serializers

from consumers.api_base import ErrorSerializer


class AlertSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField(help_text="firing, acknowledged or resolved")
    pipeline = serializers.CharField(help_text="The pipeline's or the watch's name")
    rule = serializers.CharField()
    kind = serializers.CharField()
    pipeline_deleted = serializers.BooleanField()
    watch = serializers.CharField(allow_null=True)
    summary = serializers.CharField()
    facts = serializers.DictField()
    started_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    acknowledged_at = serializers.DateTimeField(allow_null=True)
    acknowledged_by = serializers.CharField(allow_null=True)
    resolved_at = serializers.DateTimeField(allow_null=True)
    reminders_sent = serializers.IntegerField()


class AlertListSerializer(serializers.Serializer):
    alerts = AlertSerializer(many=True)


class NotificationSerializer(serializers.Serializer):
    channel = serializers.CharField(allow_null=True, help_text="null: the rule's own email recipients")
    kind = serializers.CharField()
    sequence = serializers.IntegerField()
    attempts = serializers.IntegerField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    # Without it, a message the outbox gave up (the receiver refused it until ALERT_CHANNEL_GIVE_UP_HOURS, or an
    # email its last attempt) read like one still being retried: neither is delivered, both have an error.
    failed_at = serializers.DateTimeField(allow_null=True, help_text="When the outbox gave it up; null: delivered "
                                          "or still being tried")
    last_error = serializers.CharField(allow_null=True)


class AlertDetailSerializer(AlertSerializer):
    notifications_count = serializers.IntegerField(help_text="All of the alert's notifications")
    notifications_page = serializers.IntegerField()
    notifications_pages = serializers.IntegerField()
    notifications_next = serializers.URLField(allow_null=True, help_text="The next page; null on the last")
    notifications = NotificationSerializer(many=True, help_text="One page of them, newest first")


class AlertAnswerSerializer(serializers.Serializer):
    alert = AlertSerializer()


class AlertRefusedSerializer(ErrorSerializer):
    alert = AlertSerializer()


class MuteSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    rule = serializers.CharField()
    pipeline = serializers.CharField(help_text="The pipeline's name, or the watch's (as in the alert)")
    watch = serializers.CharField(allow_null=True, help_text="The watch's name when the alert is about a watch")
    until = serializers.DateTimeField()


class MutedSerializer(AlertAnswerSerializer):
    mute = MuteSerializer()


class ChannelSerializer(serializers.Serializer):
    """A channel as anyone may see it: its kind's settings masked (no secret), routing and delivery health."""
    name = serializers.CharField()
    kind = serializers.CharField()
    enabled = serializers.BooleanField()
    rules = serializers.JSONField(help_text='The rule names it serves, or "all"')
    state = serializers.CharField(help_text="ok or failing")
    failing_since = serializers.DateTimeField(allow_null=True)
    consecutive_failures = serializers.IntegerField()
    last_success_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)


class ChannelListSerializer(serializers.Serializer):
    channels = ChannelSerializer(many=True)


class ChannelAnswerSerializer(serializers.Serializer):
    channel = ChannelSerializer()


class ChannelTestSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    answer = serializers.CharField(allow_blank=True, help_text="What the receiver answered")
    error = serializers.CharField(required=False)
