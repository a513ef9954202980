"""Retention of Tally's own tables: what is past its setting goes, in bounded batches, from Celery beat.

    runs            ConsumerRun rows that ended (or last heartbeat) more than TALLY_RETAIN_RUNS_DAYS ago, except a
                    pipeline's last run and its current epoch's runs (a halted run holds its pipeline)
    dead letters    replayed ones (their DeadLetterReplay rows: the sink rows now account for the offset) after
                    TALLY_RETAIN_DEAD_LETTERS_DAYS; discarded ones keep their row -- offset, error and reason, which
                    reconciliation counts for the offset -- and lose their payload (key and value)
    topic checks    finished (done or failed) jobs after TALLY_RETAIN_TOPIC_CHECKS_DAYS
    action log      entries older than TALLY_RETAIN_ACTION_LOG_DAYS: the audit trail, kept longest (settings
                    refuse a shorter setting than any other); the sign-in log (django-axes' AccessLog) with it.
                    A pipeline's rewinds that took effect stay: reconciliation and alerts read them back (a range a
                    rewind forward skipped is planned, not lost, also when verified again years later)
    sessions        expired ones (what Django's `clearsessions` deletes): a row per sign-in otherwise stays
    API tokens      expired ones (django-rest-knox deletes one only when it is sent again, so a token a script
                    stopped using stayed for good, and still counted toward its owner's live tokens in the admin)
Alert history is alerts/retention.py's (alerts sit above this package). Live runs, pending dead letters and
queued or running jobs are never touched, whatever their age.
"""
from dataclasses import dataclass
from datetime import datetime, timedelta

from axes.models import AccessLog
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone
from knox.models import AuthToken

from consumers.models import (
    ActionLog,
    ConsumerRun,
    DeadLetter,
    DeadLetterReplay,
    TopicCheckJob,
    TopicCheckStatus,
)

# Rows deleted per transaction: a delete of millions of old rows never holds its locks (or bloats one
# transaction's WAL) for long, and the beat task goes on with the next batch at once.
DELETE_BATCH = 5_000


@dataclass(frozen=True)
class Kind:
    """One kind of history: its label, setting, and the rows past retention at `cutoff`."""

    name: str
    setting: str

    def days(self) -> int:
        return getattr(settings, self.setting)

    def cutoff(self, now: datetime) -> datetime:
        return now - timedelta(days=self.days())


RUNS = Kind("runs", "TALLY_RETAIN_RUNS_DAYS")
DEAD_LETTERS = Kind("replayed or discarded dead letters", "TALLY_RETAIN_DEAD_LETTERS_DAYS")
TOPIC_CHECKS = Kind("topic-check jobs", "TALLY_RETAIN_TOPIC_CHECKS_DAYS")
ACTION_LOG = Kind("action log", "TALLY_RETAIN_ACTION_LOG_DAYS")


def expired_runs(now: datetime):
    cutoff = RUNS.cutoff(now)
    # A pipeline's current epoch and last run stay, whatever their age: a run that halted it holds it for an
    # operator (the supervisor reads it, Pipeline.halted_run), and the page and the no-consumer alert say when
    # and how it last ran. A few rows per pipeline. Asked per candidate, read from run_newest_idx (one probe).
    newest = ConsumerRun.objects.filter(pipeline=OuterRef("pipeline")).order_by("-started_at", "-pk").values("pk")[:1]
    # A run killed without a word keeps its live state: silent for the whole retention period, it is long gone.
    return (ConsumerRun.objects.filter(Q(ended_at__lt=cutoff) | Q(ended_at__isnull=True, heartbeat_at__lt=cutoff))
            .exclude(epoch=F("pipeline__epoch")).exclude(pk=Subquery(newest)))


def expired_replays(now: datetime):
    return DeadLetterReplay.objects.filter(replayed_at__lt=DEAD_LETTERS.cutoff(now))


def expired_discarded_payloads(now: datetime):
    return (DeadLetter.objects.filter(discarded_at__lt=DEAD_LETTERS.cutoff(now))
            .filter(Q(key__isnull=False) | Q(value__isnull=False)))


def expired_topic_checks(now: datetime):
    return TopicCheckJob.objects.filter(status__in=(TopicCheckStatus.DONE, TopicCheckStatus.FAILED),
                                        finished_at__lt=TOPIC_CHECKS.cutoff(now))


def expired_actions(now: datetime):
    kept = ActionLog.objects.rewinds_in_effect().filter(pipeline__isnull=False)
    return ActionLog.objects.filter(created_at__lt=ACTION_LOG.cutoff(now)).exclude(pk__in=kept.values("pk"))


def expired_sign_ins(now: datetime):
    return AccessLog.objects.filter(attempt_time__lt=ACTION_LOG.cutoff(now))


def expired_sessions(now: datetime):
    return Session.objects.filter(expire_date__lt=now)


def expired_api_tokens(now: datetime):
    return AuthToken.objects.filter(expiry__lt=now)


def in_batches(queryset, change) -> int:
    """Apply `change` (a function of a queryset of the rows, returning how many it changed) to what `queryset`
    matches, DELETE_BATCH rows per transaction, so no transaction holds a long history's rows at once;
    returns how many rows changed in all."""
    changed = 0
    while True:
        with transaction.atomic():
            # Unordered: any DELETE_BATCH rows will do, and the scan stops once it has them (an order would make
            # every batch judge every candidate first).
            ids = list(queryset.order_by().values_list("pk", flat=True)[:DELETE_BATCH])
            if not ids:
                return changed
            changed += change(queryset.model.objects.filter(pk__in=ids))


def delete_in_batches(queryset) -> int:
    """Delete what `queryset` matches in batches; returns how many."""
    return in_batches(queryset, lambda rows: rows.delete()[1].get(rows.model._meta.label, 0))


def _clear_payloads_in_batches(queryset) -> int:
    return in_batches(queryset, lambda rows: rows.update(key=None, value=None))


def apply(now: datetime | None = None) -> dict[str, int]:
    """Delete what is past its setting; returns the rows deleted (or cleared) per kind."""
    now = now or timezone.now()
    return {
        "runs": delete_in_batches(expired_runs(now)),
        "dead_letter_replays": delete_in_batches(expired_replays(now)),
        "discarded_dead_letter_payloads": _clear_payloads_in_batches(expired_discarded_payloads(now)),
        "topic_checks": delete_in_batches(expired_topic_checks(now)),
        "action_log": delete_in_batches(expired_actions(now)),
        "sign_ins": delete_in_batches(expired_sign_ins(now)),
        "expired_sessions": delete_in_batches(expired_sessions(now)),
        "expired_api_tokens": delete_in_batches(expired_api_tokens(now)),
    }


def counts(now: datetime | None = None) -> list[dict]:
    """For the admin page: per kind, its setting, how many rows are kept and how many are past retention."""
    now = now or timezone.now()
    rows = [
        (RUNS, ConsumerRun.objects.all(), expired_runs(now)),
        (DEAD_LETTERS, DeadLetterReplay.objects.all(), expired_replays(now)),
        (TOPIC_CHECKS, TopicCheckJob.objects.all(), expired_topic_checks(now)),
        (ACTION_LOG, ActionLog.objects.all(), expired_actions(now)),
    ]
    return [{"name": kind.name, "setting": kind.setting, "days": kind.days(), "rows": everything.count(),
             "past_retention": expired.count()} for kind, everything, expired in rows]
