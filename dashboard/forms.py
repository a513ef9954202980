"""Forms for operator input: pipelines, topic checks, dead-letter filters and actions (the offset moves' forms
are in consumers/offset_move_forms.py, which the admin shares). Validation turns bad input into clear messages
before anything is read from Kafka or changed. The rules are the operations' (dead_letter_queries.validate_range,
pipeline_setup.validate), the same the API's serializers and the commands call; a form only places their
Invalid beside its field."""
from django import forms

from consumers.engine import json_map
from consumers.form_errors import add_problems
from consumers.kafka import clusters
from consumers.models import IsolationLevel, KafkaClient, LogTruncatedPolicy
from consumers.operations import dead_letter_queries as queries
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.errors import Invalid
from consumers.operations.offset_specs import MAX_OFFSET, MAX_PARTITION


def cluster_choices() -> list[tuple[str, str]]:
    """The configured Kafka clusters, for a select; only "default" while the clusters file cannot be read (the
    pages that list clusters say why)."""
    return [(name, name) for name in clusters.names_or_default()]


class ClusterField(forms.CharField):
    """A Kafka cluster's name, picked from the configured ones. Whether it exists is the operation's check
    (pipeline_setup, watch_setup), as for the command and the API: the same message at every door."""

    def __init__(self, **kwargs):
        kwargs.setdefault("help_text", "The Kafka cluster: default, or one of the file TALLY_KAFKA_CLUSTERS names.")
        # A callable: the choices are read each time the select is drawn (the file may have changed).
        super().__init__(max_length=64, required=False, initial=clusters.DEFAULT, label="Kafka cluster",
                         widget=forms.Select(choices=cluster_choices), **kwargs)

    def widget_attrs(self, widget):
        attrs = super().widget_attrs(widget)
        attrs.pop("maxlength", None)   # a text input's attribute, not a select's
        return attrs

    def clean(self, value):
        return super().clean(value) or clusters.DEFAULT


class TopicCheckRequestForm(forms.Form):
    """A topic check of a pipeline: its topic range against its own sink table. Nothing else is taken from
    the request (no table or column name), so no other table can be read through a topic check."""

    pipeline = forms.SlugField(max_length=100)


class PipelineForm(forms.Form):
    """The operator's door to consumers.operations.pipeline_setup: the same fields as `pipeline create`; the checks
    (topic, sink table, names) are pipeline_setup's, shown beside the field they concern."""

    name = forms.CharField(max_length=100, help_text="Lower-case letters, digits, '-' and '_'.")
    topic = forms.CharField(max_length=249, help_text="The Kafka topic to consume; it must exist.")
    cluster = ClusterField()
    sink_table = forms.CharField(max_length=63, help_text="The PostgreSQL table the pipeline writes.")
    mode = forms.ChoiceField(choices=[(m, m) for m in ("exactly-once", "at-least-once", "at-most-once")],
                             initial="exactly-once")
    transform = forms.CharField(max_length=200, initial="int_value",
                                help_text="json (the JSON fields onto the table's own columns, by their types), "
                                          "int_value, json_event, csv_ints, or a dotted path to your own Transform.")
    group = forms.CharField(max_length=255, required=False, help_text="Kafka consumer group id; default: the name.")
    engine = forms.ChoiceField(choices=[("python", "python (kafka-python)"), ("spark", "spark")], initial="python")
    isolation_level = forms.ChoiceField(
        choices=IsolationLevel.choices, initial=IsolationLevel.READ_COMMITTED,
        help_text="Read committed: records of aborted transactions never reach the sink (the python engine can "
                  "also read uncommitted).")
    on_log_truncated = forms.ChoiceField(
        choices=LogTruncatedPolicy.choices, initial=LogTruncatedPolicy.STOP, label="When the log was truncated",
        help_text="Records deleted from Kafka before they were read (retention, a recreated topic): stop and say "
                  "why, or skip them (noted in the ledger, reported by reconciliation, alerted).")
    runs = forms.IntegerField(
        initial=1, required=False, label="Runs",
        help_text="Engine processes running the pipeline at once; they split its partitions and are supervised as "
                  "one (python engine). Empty: 1.")
    kafka_client = forms.ChoiceField(
        choices=KafkaClient.choices, initial=KafkaClient.WORKER_DEFAULT, required=False, label="Kafka client",
        help_text="The python engine's Kafka client: librdkafka (confluent-kafka) decodes records outside Python's "
                  "lock, so one pipeline reads faster; kafka-python is the default.")
    create_table = forms.BooleanField(required=False, label="Create the sink table if it is missing")
    map = forms.CharField(
        required=False, label="Mapping (transform json)", max_length=20_000,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "order_id=id\ncustomer=customer.name"}),
        help_text="One COLUMN=SOURCE per line, for the columns that do not take the top-level field of their name: "
                  "a dotted path (items.0.sku), @key, @key.PATH, @timestamp, @partition, @offset or @header:NAME. "
                  "A number into a timestamp or date column counts epoch milliseconds unless the source names its "
                  "unit: sent_at=sent::seconds (or ::microseconds, ::nanoseconds). "
                  "Preview proposes one from the table's columns and the topic's records.")
    upsert_key = forms.CharField(required=False, max_length=1000, label="Upsert key",
                                 help_text="COLUMN[,COLUMN]: keep one row per key, updated in place (the table needs "
                                           "a unique constraint on it). Empty: append every record.")
    delete_on_tombstone = forms.BooleanField(required=False, label="Delete the key's row on a tombstone (null value)")

    def clean_map(self) -> dict:
        lines = [line.strip() for line in self.cleaned_data["map"].splitlines() if line.strip()]
        try:
            return json_map.parse_map_options(lines)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_upsert_key(self) -> list:
        return [part.strip() for part in self.cleaned_data["upsert_key"].split(",") if part.strip()]

    @staticmethod
    def map_text(mapping: dict) -> str:
        return "\n".join(f"{column}={source}" for column, source in mapping.items())

    def clean_runs(self):
        # Only the blank is the form's to decide; the limits are pipeline_setup's, like the command line's.
        runs = self.cleaned_data["runs"]
        return 1 if runs is None else runs


class DeadLetterFilterForm(forms.Form):
    """Which dead letters of a pipeline to list or export: the page's filters and the API's query parameters."""

    error = forms.CharField(required=False, max_length=queries.MAX_ERROR_FILTER, label="Error contains")
    partition = forms.IntegerField(required=False, min_value=0, max_value=MAX_PARTITION,
                                   error_messages={"invalid": "A partition is a whole number, e.g. 0."})
    offset_from = forms.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET, label="Offset from",
                                     error_messages={"invalid": "An offset is a whole number, e.g. 1200."})
    offset_to = forms.IntegerField(required=False, min_value=0, max_value=MAX_OFFSET, label="to (inclusive)",
                                   error_messages={"invalid": "An offset is a whole number, e.g. 1200."})
    state = forms.ChoiceField(required=False, choices=[(s, s) for s in queries.STATES], initial=queries.PENDING)

    def clean(self):
        cleaned = super().clean()
        try:
            queries.validate_range(cleaned.get("offset_from"), cleaned.get("offset_to"))
        except Invalid as exc:
            add_problems(self, exc)
        cleaned["state"] = cleaned.get("state") or queries.PENDING
        return cleaned

    def filters(self) -> queries.Filters:
        data = self.cleaned_data
        return queries.Filters(error=data["error"], partition=data["partition"], offset_from=data["offset_from"],
                               offset_to=data["offset_to"], state=data["state"])

    def query(self) -> dict:
        """The validated filters as query parameters (empty ones left out), for links and redirects."""
        return {name: value for name, value in self.cleaned_data.items() if value not in (None, "")}


class DeadLetterIdsField(forms.Field):
    """The ticked dead letters: one `ids` value per checkbox, each a whole number."""

    widget = forms.MultipleHiddenInput
    default_error_messages = {"required": "Select at least one dead letter.",
                              "invalid": "Dead letter ids are whole numbers."}

    def to_python(self, value):
        values = value if isinstance(value, list | tuple) else [value] if value else []
        try:
            return sorted({int(item) for item in values})
        except (TypeError, ValueError):
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid") from None

    def validate(self, value):
        super().validate(value)
        if len(value) > dead_letter_ops.MAX_PER_CALL:
            raise forms.ValidationError(f"At most {dead_letter_ops.MAX_PER_CALL} dead letters at a time.")


class DeadLetterReplayForm(forms.Form):
    ids = DeadLetterIdsField()


class DeadLetterAllMatchingForm(forms.Form):
    """"Select all N matching": the count the operator saw, and whether they confirmed acting on that many."""

    expected = forms.IntegerField(min_value=1, error_messages={
        "required": "The number of matching dead letters is missing: select them again.",
        "invalid": "The number of matching dead letters is a whole number."})
    confirmed = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=dead_letter_ops.MAX_REASON, strip=True)

    def __init__(self, *args, discard: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if discard:
            self.fields["reason"].required = True
            self.fields["reason"].error_messages["required"] = dead_letter_ops.REASON_PROMPT


class DeadLetterDiscardForm(DeadLetterReplayForm):
    reason = forms.CharField(max_length=dead_letter_ops.MAX_REASON, strip=True,
                             error_messages={"required": dead_letter_ops.REASON_PROMPT},
                             help_text="Why they are dropped (kept with them and in the action log).")
