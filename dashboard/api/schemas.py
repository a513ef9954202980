"""What the API answers, declared for its OpenAPI schema (/api/schema/): one serializer per response shape.

The views build their answers from the domain's `as_json`/`as_dict`; these declarations say what those hold, and
tests/test_api_responses.py checks every operation's real answers (2xx and refusals, after real history) against
the schema, so a declaration that drifts from the code fails there. Free-form parts (a finding's details, an
action's parameters, a check's counts) are declared as JSON objects: their keys vary with the kind.
"""
from rest_framework import serializers

from consumers.api_base import FieldErrorsSerializer

OBJECT = serializers.DictField  # a JSON object whose keys vary
NOT_MEASURED = "null before the first reconciliation: nothing was measured yet"
NOT_AUDITED = "null before the first check, and for a watch that names no table (lag only): nothing was audited"


class ApiRootSerializer(serializers.Serializer):
    pipelines = serializers.URLField()
    groups = serializers.URLField()
    watches = serializers.URLField()
    clusters = serializers.URLField()
    action_log = serializers.URLField()
    me = serializers.URLField()
    token = serializers.URLField()
    schema = serializers.URLField()
    docs = serializers.URLField()
    alerts = serializers.URLField()


class TokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Send it as `Authorization: Token <token>`. Shown in this answer "
                                            "only: Tally keeps its digest")
    expiry = serializers.DateTimeField(allow_null=True, help_text="When it stops working "
                                       "(TALLY_API_TOKEN_TTL_DAYS); null: until revoked")


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="operator, viewer or none")
    can_operate = serializers.BooleanField()


class PipelineRowSerializer(serializers.Serializer):
    name = serializers.CharField()
    topic = serializers.CharField()
    cluster = serializers.CharField()
    group_id = serializers.CharField()
    sink_table = serializers.CharField()
    delivery_mode = serializers.CharField()
    engine = serializers.CharField()
    desired_state = serializers.CharField()
    epoch = serializers.IntegerField()
    status = serializers.CharField(help_text="OK, WARN, ERR, STALL, STOP or UNKNOWN (never reconciled)")
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    records_per_second = serializers.FloatField(allow_null=True)
    lost = serializers.IntegerField(allow_null=True, help_text=NOT_MEASURED)
    duplicated = serializers.IntegerField(allow_null=True, help_text=NOT_MEASURED)
    phantom = serializers.IntegerField(allow_null=True, help_text=NOT_MEASURED)
    dead_lettered = serializers.IntegerField(allow_null=True, help_text=NOT_MEASURED)
    last_reconciliation = serializers.DateTimeField(allow_null=True)


class GroupRowSerializer(serializers.Serializer):
    group_id = serializers.CharField()
    cluster = serializers.CharField()
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    records_per_second = serializers.FloatField(allow_null=True)
    sampled_at = serializers.DateTimeField(allow_null=True)


class PipelineListSerializer(serializers.Serializer):
    pipelines = PipelineRowSerializer(many=True)
    groups = GroupRowSerializer(many=True, help_text="Groups Tally does not run, as last sampled")


class PipelineSettingsSerializer(serializers.Serializer):
    name = serializers.CharField()
    topic = serializers.CharField()
    sink_table = serializers.CharField()
    mode = serializers.CharField()
    transform = serializers.CharField()
    group = serializers.CharField()
    engine = serializers.CharField()
    map = OBJECT()
    upsert_key = serializers.ListField(child=serializers.CharField())
    delete_on_tombstone = serializers.BooleanField()
    desired_state = serializers.CharField()


class PreviewColumnSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    source = serializers.CharField(allow_null=True, help_text="Where the column comes from; null: not written")


class PreviewRecordSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    key = serializers.CharField(allow_null=True)
    row = OBJECT(allow_null=True, help_text="column -> the value as the table holds it")
    dead_letter = serializers.CharField(allow_null=True)
    deletes = OBJECT(allow_null=True, help_text="A tombstone: the key whose row it deletes")


class PreviewSerializer(serializers.Serializer):
    columns = PreviewColumnSerializer(many=True)
    mapping = OBJECT()
    proposed = OBJECT()
    records = PreviewRecordSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField(), help_text="Likely mistakes that still convert, "
                                  "such as epoch seconds read as milliseconds: notes only, the rows are as written")


class PartitionStateSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    next_offset = serializers.IntegerField(allow_null=True)
    replay_until = serializers.IntegerField(allow_null=True)
    log_start = serializers.IntegerField(allow_null=True)
    high_watermark = serializers.IntegerField(allow_null=True)
    kafka_committed = serializers.IntegerField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    verified_offset = serializers.IntegerField(allow_null=True)
    lost = serializers.IntegerField(allow_null=True)
    duplicated = serializers.IntegerField(allow_null=True)
    phantom = serializers.IntegerField(allow_null=True)
    dead_lettered = serializers.IntegerField(allow_null=True)
    unrecoverable = serializers.IntegerField(allow_null=True)
    findings = serializers.ListField(child=OBJECT(), allow_null=True)
    status = serializers.CharField(allow_null=True)
    checked_at = serializers.DateTimeField(allow_null=True)


RANGES = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField(), min_length=2,
                                                           max_length=2), help_text="[start, end) offset ranges")


class LedgerTimelineSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    covered = RANGES
    gaps = RANGES
    overlaps = RANGES
    rewinds = serializers.ListField(child=serializers.IntegerField())
    batches = serializers.IntegerField()
    holes = serializers.IntegerField()
    holey = RANGES


class RunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    epoch = serializers.IntegerField()
    worker = serializers.CharField(help_text="host:pid")
    state = serializers.CharField(help_text="By the liveness rule: a live run's state, dead, or how it ended")
    stored_state = serializers.CharField()
    live = serializers.BooleanField()
    liveness = serializers.CharField()
    since = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_null=True)
    assigned_partitions = serializers.ListField(child=serializers.IntegerField())
    records_processed = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    heartbeat_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)
    end_reason = serializers.CharField(allow_blank=True)


class ActionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    actor = serializers.CharField()
    action = serializers.CharField()
    pipeline = serializers.CharField(allow_null=True)
    group = serializers.CharField(allow_null=True)
    cluster = serializers.CharField(allow_null=True)
    dry_run = serializers.BooleanField()
    result = serializers.CharField(help_text="running, done, refused or failed")
    params = OBJECT()
    offsets_before = OBJECT()
    offsets_after = OBJECT()
    message = serializers.CharField(allow_blank=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class PipelineDetailSerializer(PipelineRowSerializer):
    transform = serializers.CharField()
    batch_size = serializers.IntegerField()
    isolation_level = serializers.CharField()
    on_log_truncated = serializers.CharField()
    parallel_runs = serializers.IntegerField()
    kafka_client = serializers.CharField(allow_blank=True, help_text="kafka-python, librdkafka, or empty: the "
                                                                     "worker's TALLY_KAFKA_CLIENT")
    waiting_for_worker = serializers.BooleanField()
    map = OBJECT()
    upsert_key = serializers.ListField(child=serializers.CharField())
    delete_on_tombstone = serializers.BooleanField()
    last_error = serializers.CharField(allow_null=True, help_text="The last run failure, halt, sink error or "
                                                                  "supervisor restart (\"KIND: DETAIL\"), or null")
    cluster_problem = serializers.CharField(allow_null=True, help_text="Why its Kafka cluster cannot be used now "
                                                                       "(not configured, a secret file missing): "
                                                                       "a start, a rewind or a trace is refused "
                                                                       "until it is fixed; or null")
    partitions = PartitionStateSerializer(many=True)
    ledger = LedgerTimelineSerializer(many=True)
    runs = RunSerializer(many=True)
    recent_actions = ActionSerializer(many=True)


class ReportPartitionSerializer(serializers.Serializer):
    """A partition of a reconciliation: fresh (POST) or as last stored (GET, which has no verified_offset)."""
    partition = serializers.IntegerField()
    log_start = serializers.IntegerField(allow_null=True)
    high_watermark = serializers.IntegerField(allow_null=True)
    next_offset = serializers.IntegerField(allow_null=True)
    kafka_committed = serializers.IntegerField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    lost = serializers.IntegerField()
    duplicated = serializers.IntegerField()
    phantom = serializers.IntegerField()
    dead_lettered = serializers.IntegerField()
    unrecoverable = serializers.IntegerField()
    status = serializers.CharField()
    findings = serializers.ListField(child=OBJECT(), help_text="{kind, start, end, count, ...} per finding")
    verified_offset = serializers.IntegerField(allow_null=True, required=False)
    checked_at = serializers.DateTimeField(required=False)


class ReportPipelineSerializer(serializers.Serializer):
    """A pipeline's reconciliation; the stored one (GET) holds nulls before the first pass."""
    name = serializers.CharField()
    status = serializers.CharField(allow_null=True)
    lost = serializers.IntegerField(allow_null=True)
    duplicated = serializers.IntegerField(allow_null=True)
    phantom = serializers.IntegerField(allow_null=True)
    dead_lettered = serializers.IntegerField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    checked_at = serializers.DateTimeField(allow_null=True)
    partitions = ReportPartitionSerializer(many=True)
    delivery_mode = serializers.CharField(required=False)
    exact = serializers.BooleanField(required=False)
    records_per_second = serializers.FloatField(allow_null=True, required=False)
    kafka_error = serializers.CharField(allow_null=True, required=False)
    sink_error = serializers.CharField(allow_null=True, required=False)


class ReconciliationSerializer(serializers.Serializer):
    pipelines = ReportPipelineSerializer(many=True)


class DeadLetterRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.CharField()
    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True)
    key = serializers.CharField(allow_null=True)
    value = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    state_at = serializers.DateTimeField(allow_null=True)
    state_by = serializers.CharField(allow_null=True, allow_blank=True)
    reason = serializers.CharField(allow_null=True, allow_blank=True)
    rows_written = serializers.IntegerField(allow_null=True)
    replay_attempts = serializers.IntegerField(allow_null=True)


class DeadLetterPageSerializer(serializers.Serializer):
    pipeline = serializers.CharField()
    filters = OBJECT()
    count = serializers.IntegerField()
    page = serializers.IntegerField()
    pages = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    dead_letters = DeadLetterRowSerializer(many=True)


class DeadLetterOutcomeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    partition = serializers.IntegerField(allow_null=True)
    offset = serializers.IntegerField(allow_null=True)
    result = serializers.CharField()
    rows = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True)


class DeadLetterActionSerializer(serializers.Serializer):
    """One call (by ids), or "all matching" in batches (then `batches`, `action_ids` and `messages`)."""
    pipeline = serializers.CharField()
    action = serializers.CharField()
    counts = serializers.DictField(child=serializers.IntegerField())
    dead_letters = DeadLetterOutcomeSerializer(many=True)
    action_id = serializers.IntegerField(required=False)
    message = serializers.CharField(required=False, allow_blank=True)
    ids = serializers.IntegerField(required=False)
    batches = serializers.IntegerField(required=False)
    batches_done = serializers.IntegerField(required=False)
    action_ids = serializers.ListField(child=serializers.IntegerField(), required=False)
    messages = serializers.ListField(child=serializers.CharField(), required=False)
    failed = serializers.CharField(required=False, allow_blank=True)
    untouched = serializers.IntegerField(required=False)


class DeadLetterStoppedSerializer(DeadLetterActionSerializer):
    """A batch after the first was refused or failed: `error` says what the batches before it did (`counts`,
    `action_ids`), which stay done, and why the `untouched` rest was not."""
    error = serializers.CharField()


class TraceSerializer(serializers.Serializer):
    pipeline = serializers.CharField()
    topic = serializers.CharField()
    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    verdict = serializers.CharField()
    explanation = serializers.CharField()
    record = OBJECT(allow_null=True)
    position = serializers.IntegerField(allow_null=True)
    batches = serializers.ListField(child=OBJECT())
    rows = serializers.ListField(child=OBJECT())
    dead_letter = OBJECT(allow_null=True)


class KeyTraceSerializer(serializers.Serializer):
    key = serializers.CharField()
    scanned = serializers.IntegerField()
    traces = TraceSerializer(many=True)


class TraceErrorSerializer(FieldErrorsSerializer):
    field = serializers.CharField(allow_null=True, required=False, help_text="The query parameter refused")


class MoveSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    current = serializers.IntegerField(allow_null=True)
    new = serializers.IntegerField()
    log_start = serializers.IntegerField(allow_null=True)
    high_watermark = serializers.IntegerField(allow_null=True)
    reprocess = serializers.IntegerField()
    skip = serializers.IntegerField()


class RewindMoveSerializer(MoveSerializer):
    rows_deleted = serializers.IntegerField()
    rows_to_delete = serializers.IntegerField()


class OffsetMovePlanSerializer(serializers.Serializer):
    """What a rewind and a group reset share: the move asked for, planned (dry run) or done, and its audit entry."""
    mode = serializers.CharField()
    value = serializers.CharField(allow_null=True)
    dry_run = serializers.BooleanField()
    action_id = serializers.IntegerField()
    result = serializers.CharField()
    message = serializers.CharField(allow_blank=True)
    reprocess = serializers.IntegerField(help_text="Records that will be read again")
    skip = serializers.IntegerField(help_text="Records that will never be read")


class RewindSerializer(OffsetMovePlanSerializer):
    pipeline = serializers.CharField()
    rollback_sink = serializers.BooleanField()
    resumed = serializers.BooleanField()
    partitions = RewindMoveSerializer(many=True)
    rows_to_delete = serializers.IntegerField()


class GroupResetSerializer(OffsetMovePlanSerializer):
    group = serializers.CharField()
    topic = serializers.CharField()
    partitions = MoveSerializer(many=True)


class ClusterSerializer(serializers.Serializer):
    """A cluster's settings as `kafka clusters --json` shows them (never a secret: only where it is read from),
    and its check."""
    name = serializers.CharField()
    bootstrap_servers = serializers.CharField()
    security_protocol = serializers.CharField()
    warning = serializers.CharField(allow_null=True, help_text="Settings that work but send a password or token "
                                                               "unencrypted (SASL PLAIN or OAUTHBEARER over "
                                                               "SASL_PLAINTEXT)")
    reachable = serializers.BooleanField()
    check = OBJECT(help_text="Each step of the check and, on failure, the step, cause and detail")
    last_error = serializers.CharField(allow_null=True)
    last_error_at = serializers.DateTimeField(allow_null=True)
    pipelines = serializers.ListField(child=serializers.CharField())
    watches = serializers.ListField(child=serializers.CharField())


class UnconfiguredClusterSerializer(serializers.Serializer):
    name = serializers.CharField()
    pipelines = serializers.ListField(child=serializers.CharField())
    watches = serializers.ListField(child=serializers.CharField())


class ClusterListSerializer(serializers.Serializer):
    clusters = ClusterSerializer(many=True)
    error = serializers.CharField(allow_null=True, help_text="Why the clusters file could not be read")
    not_configured = UnconfiguredClusterSerializer(many=True, help_text="Cluster names pipelines or watches use "
                                                   "that no configured cluster has: they cannot start, rewind or be "
                                                   "checked until it is back under that name")


class GroupEntrySerializer(serializers.Serializer):
    group_id = serializers.CharField()
    cluster = serializers.CharField()
    pipeline = serializers.CharField(allow_null=True)


class GroupListSerializer(serializers.Serializer):
    groups = GroupEntrySerializer(many=True)
    errors = serializers.DictField(child=serializers.CharField(), help_text="cluster -> why it did not answer")


class GroupPartitionSerializer(serializers.Serializer):
    topic = serializers.CharField()
    partition = serializers.IntegerField()
    committed = serializers.IntegerField(allow_null=True)
    log_start = serializers.IntegerField(allow_null=True)
    high_watermark = serializers.IntegerField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)


class GroupDetailSerializer(serializers.Serializer):
    group_id = serializers.CharField()
    cluster = serializers.CharField()
    state = serializers.CharField()
    protocol_type = serializers.CharField(allow_blank=True)
    members = serializers.ListField(child=OBJECT())
    pipeline = serializers.CharField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    errors = serializers.ListField(child=serializers.CharField())
    partitions = GroupPartitionSerializer(many=True)


class ActionLogSerializer(serializers.Serializer):
    actions = ActionSerializer(many=True)


class TopicCheckSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    pipeline = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    table = serializers.CharField()
    key_column = serializers.CharField()
    progress = serializers.FloatField()
    progress_message = serializers.CharField(allow_blank=True, help_text="What a running check does now; a failed "
                                                                         "one's says why (\"failed: ...\")")
    error = serializers.CharField(allow_null=True)
    result = OBJECT(allow_null=True, help_text="The check's report once done")
    requested_by = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class TopicCheckListSerializer(serializers.Serializer):
    topic_checks = TopicCheckSerializer(many=True)


class WatchPartitionSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    committed = serializers.IntegerField(allow_null=True)
    high_watermark = serializers.IntegerField(allow_null=True)
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    status = serializers.CharField(help_text="OK, WARN, ERR, STALL, STOP, REWIND or UNKNOWN (never checked)")


class WatchSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="watch")
    name = serializers.CharField()
    group_id = serializers.CharField()
    topic = serializers.CharField()
    status = serializers.CharField(help_text="OK, WARN, ERR, STALL, STOP, REWIND or UNKNOWN (never checked)")
    lag_records = serializers.IntegerField(allow_null=True)
    lag_seconds = serializers.FloatField(allow_null=True)
    lost = serializers.IntegerField(allow_null=True, help_text=NOT_AUDITED)
    duplicated = serializers.IntegerField(allow_null=True, help_text=NOT_AUDITED)
    phantom = serializers.IntegerField(allow_null=True, help_text=NOT_AUDITED)
    checked_at = serializers.DateTimeField(allow_null=True)
    partitions = serializers.ListField(child=OBJECT())
    group = serializers.CharField()
    cluster = serializers.CharField()
    sink_table = serializers.CharField(allow_blank=True)
    record_id = serializers.CharField(allow_blank=True)
    row_id = serializers.CharField(allow_blank=True)
    start_from = serializers.CharField()
    settle_seconds = serializers.IntegerField()
    ignore = serializers.ListField(child=serializers.CharField())
    keyed = serializers.BooleanField()
    last_error = serializers.CharField(allow_blank=True)


class WatchListSerializer(serializers.Serializer):
    watches = WatchSerializer(many=True)


class WatchCreatedSerializer(WatchSerializer):
    notes = serializers.ListField(child=serializers.CharField())


class WatchRangeSerializer(serializers.Serializer):
    partition = serializers.IntegerField()
    start = serializers.IntegerField()
    end = serializers.IntegerField()
    records = serializers.IntegerField()
    ignored = serializers.IntegerField()
    superseded = serializers.IntegerField()
    unreadable = serializers.IntegerField()
    lost = serializers.IntegerField()
    duplicated = serializers.IntegerField()
    phantom = serializers.IntegerField()
    lost_offsets = serializers.ListField(child=serializers.IntegerField())
    duplicated_offsets = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        help_text="[offset, extra rows] pairs")
    phantom_offsets = serializers.ListField(child=serializers.IntegerField())
    note = serializers.CharField(help_text="why the range was not audited, or what it holds; empty otherwise")
    checked_at = serializers.DateTimeField()


class WatchDetailSerializer(WatchSerializer):
    partitions = serializers.ListField(child=OBJECT())
    lost_offsets = serializers.ListField(child=OBJECT(), help_text="{partition, offset} of each lost record listed")
    duplicated_offsets = serializers.ListField(child=OBJECT())
    last_notes = serializers.ListField(child=serializers.CharField(), help_text=(
        "The last check's notes, e.g. why rows at positions without a record are not counted as phantoms "
        "(a compacted topic, or a cleanup.policy that could not be read)"))
    ranges = WatchRangeSerializer(many=True)


class WatchDeletedSerializer(serializers.Serializer):
    deleted = serializers.CharField()


class WatchTraceSerializer(serializers.Serializer):
    watch = serializers.CharField()
    topic = serializers.CharField()
    partition = serializers.IntegerField()
    offset = serializers.IntegerField()
    verdict = serializers.CharField(allow_blank=True)
    explanation = serializers.CharField(allow_blank=True)
    finding = OBJECT(allow_null=True, help_text="What the audit stored for this offset: {kind, extra, checked_at}")
    record = OBJECT(allow_null=True, help_text="key, value (previews) and timestamp_ms; null: no record there")
    expected_id = serializers.ListField(child=serializers.JSONField(), allow_null=True,
                                        help_text="The row id the record names, a value per row-id column")
    row_columns = serializers.ListField(child=serializers.CharField())
    rows_found = serializers.IntegerField()
    rows = serializers.ListField(child=OBJECT())


class WatchCheckSerializer(serializers.Serializer):
    lost = serializers.IntegerField()
    duplicated = serializers.IntegerField()
    phantom = serializers.IntegerField()
    checked = serializers.IntegerField()
    lag = OBJECT(help_text="{records, seconds}")
    status = serializers.CharField()
    lost_offsets = serializers.ListField(child=OBJECT())
    duplicated_offsets = serializers.ListField(child=OBJECT())
    notes = serializers.ListField(child=serializers.CharField())
    error = serializers.CharField(allow_null=True, help_text=(
        "Why the check failed (Kafka or the table could not be read, the topic was recreated): status ERR, and "
        "`watch check` exits 1; null when it did not fail"))
