"""Strict input of the JSON API: a body is a JSON object, each field has one JSON type, unknown fields are
refused, and a bad field is a 400 that names it — before anything is read from Kafka or moved.

Strict because loose parsing failed open: `"dry_run": "no"` was truthy and executed a rewind. A boolean
is `true` or `false`; a partition is a JSON integer; a value is a string or an integer. The semantics
of a rewind target (dates before 1970, durations that overflow, offsets beyond bigint) and of a dead-letter
offset range are checked by the operations (offset_specs.validate, dead_letter_queries.validate_range), which
the pages' forms and the command line call too: a serializer only returns their Invalid as its 400.
"""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from consumers.api_base import (  # noqa: F401 - EmptyInput, field_errors and refuse_invalid are re-exported
    EmptyInput,
    StrictBooleanField,
    StrictIntegerField,
    StrictSerializer,
    StrictStringField,
    field_errors,
    refuse_invalid,
)
from consumers.operations import dead_letter_queries, dead_letters, offset_specs
from consumers.operations.errors import Invalid
from consumers.operations.offset_specs import MAX_OFFSET, MAX_PARTITION, OFFSET_MODES
from consumers.operations.pipeline_setup import TOPIC_PATTERN
from dashboard import status

# One page of the dead-letter list: an export in pages of at most this many rows keeps each response bounded.
MAX_DEAD_LETTERS_PER_PAGE = 10_000
MAX_MAPPED_COLUMNS = 1600  # PostgreSQL's limit of columns per table


@extend_schema_field({"oneOf": [{"type": "string", "maxLength": 64}, {"type": "integer"}], "nullable": True})
class SpecValueField(serializers.Field):
    """The value of an offset move: a string ("PT10M", "2026-11-22T04:00:00Z", "-12") or an integer."""

    default_error_messages = {"invalid": "Must be a JSON string or integer (or null)."}

    def to_internal_value(self, data):
        if type(data) is int:
            return str(data)
        if isinstance(data, str) and len(data) <= 64:
            return data.strip()
        self.fail("invalid")


class OffsetMoveInput(StrictSerializer):
    mode = serializers.ChoiceField(choices=OFFSET_MODES)
    value = SpecValueField(required=False, allow_null=True, default=None)
    partitions = serializers.ListField(child=StrictIntegerField(min_value=0, max_value=MAX_PARTITION),
                                       required=False, allow_null=True, default=None, max_length=10_000)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        try:
            attrs["spec"] = offset_specs.validate(attrs["mode"], attrs.get("value") or None)
        except Invalid as exc:
            raise serializers.ValidationError(exc.problems) from None
        attrs["partitions"] = sorted(set(attrs.get("partitions") or [])) or None
        return attrs


class RewindInput(OffsetMoveInput):
    rollback_sink = StrictBooleanField(required=False, default=False)
    dry_run = StrictBooleanField(required=False, default=True)


class GroupResetInput(OffsetMoveInput):
    topic = StrictStringField(max_length=249)
    execute = StrictBooleanField(required=False, default=False)

    def validate_topic(self, value):
        if not TOPIC_PATTERN.match(value):  # Kafka's legal topic names, as pipeline_setup checks them
            raise serializers.ValidationError("A Kafka topic name: letters, digits, '.', '_' and '-', at most 249.")
        return value


class ReconcileInput(StrictSerializer):
    full = StrictBooleanField(required=False, default=False)


class ActionLogQuery(serializers.Serializer):
    """Query parameters of /api/action-log (strings from the URL; limit an integer from 1 to 500)."""

    pipeline = serializers.CharField(required=False, max_length=100,
                                     help_text="A pipeline's name, also a deleted pipeline's.")
    group = serializers.CharField(required=False, max_length=255)
    action = serializers.CharField(required=False, max_length=30)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500, default=100)

    def validate_pipeline(self, name: str) -> str:
        problem = status.unknown_action_log_pipeline(name)
        if problem:
            raise serializers.ValidationError(problem)
        return name


class DeadLetterQuery(serializers.Serializer):
    """Query parameters of GET /api/pipelines/NAME/dead-letters (strings from the URL): the page's filters,
    plus `limit` (1..10000) and `page` (from 1)."""

    state = serializers.ChoiceField(choices=dead_letter_queries.STATES, required=False,
                                    default=dead_letter_queries.PENDING)
    error = serializers.CharField(required=False, max_length=dead_letter_queries.MAX_ERROR_FILTER, default="",
                                  allow_blank=True)
    partition = serializers.IntegerField(required=False, min_value=0, max_value=MAX_PARTITION, allow_null=True,
                                         default=None)
    offset_from = serializers.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET,
                                           allow_null=True, default=None)
    offset_to = serializers.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET,
                                         allow_null=True, default=None)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_DEAD_LETTERS_PER_PAGE, default=100)
    page = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1, default=1)

    def validate(self, attrs):
        _validate_range(attrs)
        return attrs

    def filters(self) -> dead_letter_queries.Filters:
        data = self.validated_data
        return dead_letter_queries.Filters(error=data["error"], partition=data["partition"],
                                           offset_from=data["offset_from"], offset_to=data["offset_to"],
                                           state=data["state"])


def _validate_range(attrs) -> None:
    try:
        dead_letter_queries.validate_range(attrs.get("offset_from"), attrs.get("offset_to"))
    except Invalid as exc:
        raise serializers.ValidationError(exc.problems) from None


def _dead_letter_ids(**kwargs):
    return serializers.ListField(child=StrictIntegerField(min_value=1, max_value=MAX_OFFSET),
                                 allow_empty=False, max_length=dead_letters.MAX_PER_CALL, **kwargs)


class DeadLetterFilterInput(StrictSerializer):
    """"All matching": the filters of GET .../dead-letters, over pending dead letters (the ones that can be
    replayed or discarded)."""

    state = serializers.ChoiceField(choices=[dead_letter_queries.PENDING], required=False,
                                    default=dead_letter_queries.PENDING, error_messages={
                                        "invalid_choice": "Only pending dead letters are replayed or discarded."})
    error = serializers.CharField(required=False, max_length=dead_letter_queries.MAX_ERROR_FILTER, default="",
                                  allow_blank=True)
    partition = StrictIntegerField(required=False, min_value=0, max_value=MAX_PARTITION, allow_null=True,
                                   default=None)
    offset_from = StrictIntegerField(required=False, min_value=0, max_value=MAX_OFFSET,
                                     allow_null=True, default=None)
    offset_to = StrictIntegerField(required=False, min_value=0, max_value=MAX_OFFSET,
                                   allow_null=True, default=None)

    def to_internal_value(self, data):
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, dict) else []
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return super().to_internal_value(data)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        _validate_range(attrs)
        return attrs


class _DeadLetterSelection(StrictSerializer):
    """Either `ids` (at most 1,000), or `filter` with the `count` of dead letters the client expects it to match
    (any number, in batches of 1,000; another count now is refused with 409)."""

    ids = _dead_letter_ids(required=False)
    filter = DeadLetterFilterInput(required=False)
    count = StrictIntegerField(required=False, min_value=1)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError({"ids": "Give either ids or filter (with count)."})
        if "filter" in attrs and "count" not in attrs:
            raise serializers.ValidationError({"count": "With filter, give the count of dead letters it matches."})
        if "count" in attrs and "filter" not in attrs:
            raise serializers.ValidationError({"count": "count goes with filter."})
        return attrs

    def filters(self) -> dead_letter_queries.Filters:
        return dead_letter_queries.Filters(**self.validated_data["filter"])


class DeadLetterReplayInput(_DeadLetterSelection):
    source = serializers.ChoiceField(choices=dead_letters.SOURCES, required=False, default="stored")


class DeadLetterDiscardInput(_DeadLetterSelection):
    reason = StrictStringField(max_length=dead_letters.MAX_REASON,
                               error_messages={"blank": dead_letters.REASON_PROMPT,
                                               "required": dead_letters.REASON_PROMPT})


class PipelineInput(StrictSerializer):
    """POST /api/pipelines/ (create) and /api/pipelines/preview: the fields of `pipeline create`, strictly typed.
    What they must satisfy (topic, table, mapping, key) is consumers.operations.pipeline_setup's to say."""

    name = StrictStringField(max_length=100, required=False, default="", allow_blank=True)
    topic = StrictStringField(max_length=249)
    sink_table = StrictStringField(max_length=63)
    mode = StrictStringField(max_length=20, required=False, default="exactly-once")
    transform = StrictStringField(max_length=200, required=False, default="int_value")
    group = StrictStringField(max_length=255, required=False, default="", allow_blank=True)
    engine = StrictStringField(max_length=10, required=False, default="python")
    isolation_level = StrictStringField(max_length=20, required=False, default="read_committed")
    on_log_truncated = StrictStringField(max_length=10, required=False, default="stop")
    create_table = StrictBooleanField(required=False, default=False)
    cluster = StrictStringField(max_length=100, required=False, default="default")
    runs = StrictIntegerField(required=False, default=1, min_value=1, max_value=1000)
    map = serializers.DictField(child=StrictStringField(max_length=300), required=False, default=dict)
    upsert_key = serializers.ListField(child=StrictStringField(max_length=63), required=False, default=list,
                                       max_length=32)
    delete_on_tombstone = StrictBooleanField(required=False, default=False)
    kafka_client = StrictStringField(max_length=20, required=False, default="", allow_blank=True)

    def validate_map(self, value):
        if len(value) > MAX_MAPPED_COLUMNS:
            raise serializers.ValidationError(f"At most {MAX_MAPPED_COLUMNS} columns.")
        if any(len(column) > 63 for column in value):
            raise serializers.ValidationError("A column name has at most 63 characters.")
        return value


