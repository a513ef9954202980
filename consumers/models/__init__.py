"""Models by area: pipelines and their positions; operator actions; reconciliation; Spark audits."""
from consumers.models.audit import AuditJob, AuditJobStatus
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
    Engine,
    IsolationLevel,
    LogTruncatedPolicy,
    PartitionOffset,
    Pipeline,
    ResetPolicy,
    RunState,
)
from consumers.models.reconciliation import LagSnapshot, PartitionHealth, PipelineHealth, Status

__all__ = [
    "LIVE_RUN_STATES", "ActionLog", "ActionResult", "AuditJob", "AuditJobStatus", "BadRecordPolicy", "BatchLedger",
    "ConsumerRun", "DeadLetter", "DeadLetterReplay", "DeliveryMode", "DesiredState", "Engine", "IsolationLevel",
    "LagSnapshot", "LogTruncatedPolicy", "PartitionHealth", "PartitionOffset", "Pipeline", "PipelineHealth",
    "ResetPolicy", "RunState", "Status",
]
