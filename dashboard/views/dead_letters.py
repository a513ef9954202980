"""A pipeline's dead letters: browse with filters, export as CSV, replay or discard the selected ones.
consumers.operations.dead_letter_queries reads them; consumers.operations.dead_letters replays and discards
them (one transaction, audited); these views check the role, validate the input and show the outcome."""
import csv

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from consumers.access import can_operate, form_errors, record_refusal
from consumers.models import Pipeline
from consumers.operations import dead_letter_batches as batches
from consumers.operations import dead_letter_queries as queries
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.errors import Refused
from dashboard.forms import DeadLetterAllMatchingForm, DeadLetterDiscardForm, DeadLetterFilterForm, DeadLetterReplayForm
from dashboard.views.actions import refuse_viewer
from dashboard.views.common import BadPage, page_of, render_page

PAGE_SIZE = 50
# Rows fetched per round trip while streaming an export: memory stays flat however many dead letters match.
EXPORT_CHUNK = 500


def _render(request, pipeline, filters: DeadLetterFilterForm, *, outcome=None, error: str = "", status: int = 200,
            batches_outcome=None, confirm=None, kept=None):
    context = {"nav": "overview", "pipeline": pipeline, "form": filters, "can_operate": can_operate(request.user),
               "outcome": outcome, "error": error, "pending": queries.pending_count(pipeline),
               "batches_outcome": batches_outcome, "confirm": confirm, "kept": kept or {}}
    if filters.is_valid():
        paginator = Paginator(queries.dead_letters(pipeline, filters.filters()), PAGE_SIZE)
        context["query"] = urlencode(filters.query())
        context["carry"] = filters.query()
        if request.method != "GET":
            # After an action the page shown before may have emptied: show the nearest one.
            context["page"] = paginator.get_page(request.POST.get("page"))
        else:
            try:
                context["page"] = page_of(paginator, request.GET.get("page"))
            except BadPage as exc:
                context["error"], status = str(exc), 400
    elif status == 200:
        status = 422  # htmx swaps 422: the form shows why
    return render_page(request, "dead_letters.html", context, fragment="panel", status=status)


@require_GET
@login_required
def dead_letter_list(request, name):
    pipeline = get_object_or_404(Pipeline, name=name)
    return _render(request, pipeline, DeadLetterFilterForm(request.GET))


@require_GET
@login_required
def export_csv(request, name):
    """The filtered set (every page) as CSV, streamed; key and value as text (undecodable bytes escaped), a cell
    that a spreadsheet would run as a formula behind a quote (queries.csv_row)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    filters = DeadLetterFilterForm(request.GET)
    if not filters.is_valid():
        return _render(request, pipeline, filters)
    rows = queries.dead_letters(pipeline, filters.filters()).iterator(chunk_size=EXPORT_CHUNK)
    response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{pipeline.name}-dead-letters.csv"'
    return response


class _Line:
    """csv.writer writes into this and the generator hands each line on (no buffer grows)."""

    def write(self, text):
        return text


def _csv_lines(rows):
    writer = csv.writer(_Line())
    yield writer.writerow(queries.EXPORT_NAMES)
    for row in rows:
        yield writer.writerow(queries.csv_row(row))


@require_POST
@login_required
def replay_dead_letters(request, name):
    return _act(request, name, dead_letter_ops.REPLAY, DeadLetterReplayForm,
                lambda pipeline, data, actor: dead_letter_ops.replay(pipeline, data["ids"], actor=actor))


@require_POST
@login_required
def discard_dead_letters(request, name):
    return _act(request, name, dead_letter_ops.DISCARD, DeadLetterDiscardForm,
                lambda pipeline, data, actor: dead_letter_ops.discard(pipeline, data["ids"], data["reason"],
                                                                      actor=actor))


def _act(request, name, action: str, form_class, call):
    pipeline = get_object_or_404(Pipeline, name=name)
    if not can_operate(request.user):
        return refuse_viewer(request, pipeline)
    filters = DeadLetterFilterForm(request.POST)  # the page's filters, carried so the table stays as it was
    if request.POST.get("all_matching"):
        return _act_on_matching(request, pipeline, action, filters)
    form = form_class(request.POST)
    # A refusal shows the table again with the operator's ticks and reason as they were, so that fixing the one
    # thing refused is one more click, not selecting everything again (the ids stay strings, as the boxes send them).
    kept = {"ids": request.POST.getlist("ids"), "reason": request.POST.get("reason", "")}
    # Every field is checked before anything is done, the carried filters included: a 422 changes nothing.
    if not form.is_valid() or not filters.is_valid():
        bad = form if not form.is_valid() else filters
        record_refusal(request.user, action, f"bad input: {form_errors(bad)}", pipeline=pipeline,
                       params={"ids": request.POST.getlist("ids")[:20]})
        # The reason's error goes beside its field; the others above the table.
        kept["reason_error"] = " ".join(bad.errors.get("reason", ()))   # (the filters have no reason)
        others = " ".join(e for field, errors in bad.errors.items() if field != "reason" for e in errors)
        return _render(request, pipeline, filters, error=others, status=422, kept=kept)
    try:
        result = call(pipeline, form.cleaned_data, request.user.username)
    except Refused as exc:  # audited by the domain; nothing was changed
        return _render(request, pipeline, filters, error=str(exc), status=422, kept=kept)
    except Exception as exc:  # rolled back and audited as failed (e.g. a transform that no longer fits the sink)
        return _render(request, pipeline, filters, status=422, kept=kept,
                       error=f"The {action.replace('_', ' ')} failed and changed nothing: {type(exc).__name__}: {exc}")
    return _render(request, pipeline, filters, outcome=result)


def _act_on_matching(request, pipeline, action: str, filters: DeadLetterFilterForm):
    """"Select all N matching": every pending dead letter the page's filters match, on every page. A first POST
    only asks for confirmation (nothing changes); the confirmed one acts, refused if the count moved since."""
    form = DeadLetterAllMatchingForm(request.POST, discard=action == dead_letter_ops.DISCARD)

    def refuse(reason: str, error: str):  # bad input: audited, nothing changed, the page shows why
        record_refusal(request.user, action, f"bad input: {reason}", pipeline=pipeline,
                       params={"all_matching": True, **{k: v for k, v in request.POST.items() if k in FILTER_KEYS}})
        return _render(request, pipeline, filters, error=error, status=422)

    if not filters.is_valid() or not form.is_valid():
        return refuse(form_errors(form) if filters.is_valid() else form_errors(filters),
                      _plain(form) or _plain(filters))
    if filters.cleaned_data["state"] != queries.PENDING:   # as in the API and the command: pending ones only
        return refuse(f"select all matching acts on pending dead letters only, not {filters.cleaned_data['state']!r}",
                      "Select all matching acts on pending dead letters only: set the state filter to pending.")
    kind = "replay" if action == dead_letter_ops.REPLAY else "discard"
    data = form.cleaned_data
    if not data["confirmed"]:
        return _render(request, pipeline, filters, confirm={"action": kind, "count": data["expected"],
                                                            "reason": data.get("reason", "")})
    ended = batches.attempt(kind, lambda: batches.act_on_matching(
        pipeline, kind, filters.filters(), data["expected"], actor=request.user.username,
        reason=data.get("reason", "")))
    if ended.refusal:
        return _render(request, pipeline, filters, error=str(ended.refusal), status=409)
    if ended.stopped:
        return _render(request, pipeline, filters, error=ended.stopped.message(), batches_outcome=ended.stopped,
                       status=422)
    if ended.failed:
        return _render(request, pipeline, filters, status=422, error=ended.failed)
    return _render(request, pipeline, filters, batches_outcome=ended.result)


FILTER_KEYS = ("error", "partition", "offset_from", "offset_to", "state")


def _plain(form) -> str:
    return " ".join(error for errors in form.errors.values() for error in errors)
