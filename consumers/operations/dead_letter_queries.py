"""The read side of dead letters: one pipeline's dead letters filtered (error text, partition, offset range,
state), as rows for the page, the API, the CSV export and the command line.

A dead letter has one of three states. Pending and discarded ones are `DeadLetter` rows (discarded ones keep
their offset accounted for); a replayed one is gone from that table and lives on as its replay-ledger row
(`DeadLetterReplay`, same id), which keeps its partition, offset and original error but not the record.
So "every state" is a UNION of both tables, with the same columns.
"""
from dataclasses import dataclass

from django.db.models import BigIntegerField, BinaryField, Case, CharField, DateTimeField, F, IntegerField, Value, When

from consumers.models import DeadLetter, DeadLetterReplay, Pipeline
from consumers.operations.errors import Invalid

PENDING, DISCARDED, REPLAYED, ANY = "pending", "discarded", "replayed", "any"
STATES = (PENDING, DISCARDED, REPLAYED, ANY)
MAX_ERROR_FILTER = 200
COLUMNS = ("letter_id", "state", "partition", "offset", "error_text", "key_bytes", "value_bytes", "created",
           "state_at", "state_by", "reason", "rows_written", "replay_attempts")
# The export's column names (CSV header and JSON keys), in COLUMNS order.
EXPORT_NAMES = ("id", "state", "partition", "offset", "error", "key", "value", "created_at", "state_at", "state_by",
                "reason", "rows_written", "replay_attempts")


@dataclass(frozen=True)
class Filters:
    """What to list. Offsets are inclusive at both ends; `error` matches case-insensitively anywhere."""

    error: str = ""
    partition: int | None = None
    offset_from: int | None = None
    offset_to: int | None = None
    state: str = PENDING
    ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"Unknown state {self.state!r}: use one of {', '.join(STATES)}.")


def validate_range(offset_from: int | None, offset_to: int | None) -> None:
    """The one check of an offset range across doors (form, serializer, command): both ends are inclusive.
    Invalid names the field at fault, `offset_to`."""
    if offset_from is not None and offset_to is not None and offset_from > offset_to:
        raise Invalid({"offset_to": f"The range ends before it starts ({offset_from} > {offset_to})."})


def _narrow(queryset, filters: Filters, error_field: str, id_field: str):
    if filters.error:
        queryset = queryset.filter(**{f"{error_field}__icontains": filters.error})
    if filters.partition is not None:
        queryset = queryset.filter(partition=filters.partition)
    if filters.offset_from is not None:
        queryset = queryset.filter(offset__gte=filters.offset_from)
    if filters.offset_to is not None:
        queryset = queryset.filter(offset__lte=filters.offset_to)
    if filters.ids:
        queryset = queryset.filter(**{f"{id_field}__in": filters.ids})
    return queryset


def _letters(pipeline: Pipeline, filters: Filters):
    letters = _narrow(DeadLetter.objects.filter(pipeline=pipeline), filters, "error", "pk")
    if filters.state == PENDING:
        letters = letters.filter(discarded_at__isnull=True)
    elif filters.state == DISCARDED:
        letters = letters.filter(discarded_at__isnull=False)
    return letters.annotate(
        letter_id=F("pk"),
        state=Case(When(discarded_at__isnull=True, then=Value(PENDING)), default=Value(DISCARDED),
                   output_field=CharField()),
        error_text=F("error"), key_bytes=F("key"), value_bytes=F("value"), created=F("created_at"),
        state_at=F("discarded_at"), state_by=F("discarded_by"), reason=F("discard_reason"),
        rows_written=Value(None, output_field=IntegerField()),
    ).values(*COLUMNS)


def _replays(pipeline: Pipeline, filters: Filters):
    replays = _narrow(DeadLetterReplay.objects.filter(pipeline=pipeline), filters, "original_error", "dead_letter_id")
    return replays.annotate(
        letter_id=F("dead_letter_id"), state=Value(REPLAYED, output_field=CharField()),
        error_text=F("original_error"), key_bytes=Value(None, output_field=BinaryField()),
        value_bytes=Value(None, output_field=BinaryField()), created=Value(None, output_field=DateTimeField()),
        state_at=F("replayed_at"), state_by=F("actor"), reason=Value(None, output_field=CharField()),
        replay_attempts=Value(None, output_field=BigIntegerField()),
    ).values(*COLUMNS)


def dead_letters(pipeline: Pipeline, filters: Filters = Filters()):
    """The pipeline's dead letters matching `filters`, as dicts with the keys of COLUMNS, in (partition, offset)
    order. A lazy queryset: paginate it or iterate it; nothing is read before."""
    order = ("partition", "offset", "letter_id")
    if filters.state == REPLAYED:
        return _replays(pipeline, filters).order_by(*order)
    if filters.state in (PENDING, DISCARDED):
        return _letters(pipeline, filters).order_by(*order)
    return _letters(pipeline, filters).union(_replays(pipeline, filters), all=True).order_by(*order)


def pending_count(pipeline: Pipeline) -> int:
    return DeadLetter.objects.filter(pipeline=pipeline, discarded_at__isnull=True).count()


def text(value) -> str | None:
    """A record's key or value as text: UTF-8, undecodable bytes as \\xNN escapes (nothing is lost)."""
    if value is None:
        return None
    return bytes(value).decode("utf-8", "backslashreplace")


# A cell starting with one of these runs as a formula when a CSV export is opened in a spreadsheet (OWASP's "CSV
# injection"); keys, values and errors come from the topic's producers. JSON exports keep them exact.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_row(row: dict) -> list:
    """One row of `dead_letters()` as CSV cells: None empty, a text a spreadsheet would run behind a quote."""
    return [_csv_cell(value) for value in export_row(row).values()]


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def export_row(row: dict) -> dict:
    """One row of `dead_letters()` with the export's names and JSON-friendly values."""
    out = {}
    for column, name in zip(COLUMNS, EXPORT_NAMES, strict=True):
        value = row[column]
        if column in ("key_bytes", "value_bytes"):
            value = text(value)
        elif column in ("created", "state_at"):
            value = value.isoformat() if value is not None else None
        out[name] = value
    return out
