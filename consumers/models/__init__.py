"""Models by area: pipelines and their positions; operator actions; reconciliation; topic checks; watches."""
from consumers.models.cluster import ClusterStatus
from consumers.models.operations import ActionLog, ActionResult
from consumers.models.pipeline import (
    LIVE_RUN_STATES,
    BadRecordPolicy,
    BatchLedger,
    ConsumerRun,
    DeadLetter,
    DeadLetterReplay,
    DeliveryMode,
    DesiredState,
    EndReason,
    Engine,
    IsolationLevel,
    KafkaClient,
    LedgerSummary,
    LogTruncatedPolicy,
    PartitionOffset,
    Pipeline,
    PipelineError,
    ResetPolicy,
    RunState,
    runs_problem,
)
from consumers.models.reconciliation import UNKNOWN, LagSnapshot, PartitionHealth, PipelineHealth, Status
from consumers.models.topic_check import TopicCheckJob, TopicCheckStatus
from consumers.models.watch import OFFSETS_LISTED, RANGES_SHOWN, Watch, WatchFinding, WatchPartition, WatchRange
from consumers.pg_text import error_text

__all__ = [
    "LIVE_RUN_STATES", "ActionLog", "ActionResult", "BadRecordPolicy", "BatchLedger", "ClusterStatus", "ConsumerRun",
    "DeadLetter", "DeadLetterReplay", "DeliveryMode", "DesiredState", "EndReason", "Engine", "IsolationLevel",
    "KafkaClient", "LagSnapshot", "LedgerSummary", "LogTruncatedPolicy", "PartitionHealth", "PartitionOffset",
    "Pipeline", "PipelineError", "PipelineHealth", "ResetPolicy", "RunState", "runs_problem", "Status", "TopicCheckJob",
    "TopicCheckStatus", "OFFSETS_LISTED", "RANGES_SHOWN", "UNKNOWN", "Watch", "WatchFinding", "WatchPartition",
    "WatchRange", "error_text",
]
