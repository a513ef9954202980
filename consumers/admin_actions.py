"""Operator actions in the Django admin: the same domain functions as the dashboard, the API and the CLI
(consumers.operations: actions, rewind, dead_letters), so the same validation, refusals, fencing
and action log entries. The admin only gathers the selection and the form, and reports per pipeline.

Only operators (consumers.access.can_operate) see these actions; a request from anyone else that names one
is refused with 403, and the refusal is written to the action log with the actor.
"""
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from consumers.access import AuditedRefusal, can_operate, form_errors, record_refusal
from consumers.offset_move_forms import RewindForm
from consumers.operations import actions, dead_letter_batches
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations import rewind as rewind_ops
from consumers.operations.errors import Refused


def actor_of(request) -> str:
    return request.user.get_username()


def posted_action(request) -> str:
    """The action a changelist POST runs, read as Django's ModelAdmin.response_action reads it: the `index`-th of
    the posted `action` values, or with no such index the last one (its form reads the field). A refusal check
    reading another one could be walked past by repeating `action`. "" when the POST names none."""
    if request.method != "POST":
        return ""
    try:
        index = int(request.POST.get("index", 0))
    except ValueError:
        index = 0
    try:
        return request.POST.getlist("action")[index]
    except IndexError:
        return request.POST.get("action", "")


def report(modeladmin, request, name: str, outcome: str, *, ok: bool) -> None:
    # "Pipeline NAME:" rather than "NAME:", since the admin's style capitalizes a message's first letter.
    modeladmin.message_user(request, f"Pipeline {name}: {outcome}", messages.SUCCESS if ok else messages.ERROR)


class OperatorActionsMixin:
    """Actions for operators only: hidden from everyone else, and refused (audited) if posted anyway."""

    operator_actions: tuple[str, ...] = ()

    def has_operate_permission(self, request) -> bool:
        return can_operate(request.user)

    def changelist_view(self, request, extra_context=None):
        action = posted_action(request)
        if action in self.operator_actions and not can_operate(request.user):
            self.log_refusal(request, action, request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))
            raise AuditedRefusal("Only operators can run this action.")
        return super().changelist_view(request, extra_context)

    def log_refusal(self, request, action: str, selected_ids: list[str]) -> None:
        """One refused ActionLog row per pipeline concerned (the refusal names the actor)."""
        message = f"{actor_of(request)} is not an operator: only operators can {action.replace('_', ' ')}."
        for pipeline in self.pipelines_of(selected_ids) or [None]:
            record_refusal(request.user, action, message, pipeline=pipeline,
                           params={"via": "admin", "selected": selected_ids[:100]})

    def pipelines_of(self, selected_ids: list[str]):
        return []


def dashboard_link(url: str, text: str = "dashboard"):
    return format_html('<a href="{}" class="dashboard-link">{}</a>', url, text)


def pipeline_dashboard_url(pipeline) -> str:
    return reverse("pipeline", kwargs={"name": pipeline.name})


# ---- pipelines: start, stop, pause, resume, restart -------------------------------------------------

def _state_action(name: str, description: str):
    @admin.action(description=description, permissions=["operate"])
    def run(modeladmin, request, queryset):
        for pipeline in queryset.order_by("name"):
            try:
                entry = actions.perform(name, pipeline, actor=actor_of(request))
            except Refused as exc:
                report(modeladmin, request, pipeline.name, str(exc), ok=False)
            else:
                report(modeladmin, request, pipeline.name, entry.message, ok=True)

    run.__name__ = name
    return run


start = _state_action("start", "Start the selected pipelines")
stop = _state_action("stop", "Stop the selected pipelines")
pause = _state_action("pause", "Pause the selected pipelines")
resume = _state_action("resume", "Resume the selected pipelines")
restart = _state_action("restart", "Restart the selected pipelines")


# ---- pipelines: rewind (form -> preview per pipeline -> execute) ----------------------------------

@admin.action(description="Rewind the selected pipelines…", permissions=["operate"])
def rewind(modeladmin, request, queryset):
    """The Django admin's intermediate-page pattern: the page posts back to the changelist with the
    selection and `step` (preview, execute); without `step` it shows the empty form."""
    pipelines = list(queryset.order_by("name"))
    step = request.POST.get("step", "")
    form = RewindForm(request.POST if step else None)
    context = {"pipelines": pipelines, "form": form, "step": "form"}
    if step and not form.is_valid():
        log_invalid_form(pipelines, rewind_ops.ACTION, actor_of(request), form, dry_run=step != "execute")
    if step and form.is_valid():
        data = form.cleaned_data
        arguments = {"partitions": data["partitions"] or None, "rollback_sink": data["rollback_sink"],
                     "actor": actor_of(request)}
        if step == "execute":
            for pipeline in pipelines:
                try:
                    result = rewind_ops.rewind(pipeline, data["mode"], data["value"] or None, **arguments)
                except Refused as exc:
                    report(modeladmin, request, pipeline.name, f"rewind refused: {exc}", ok=False)
                else:
                    report(modeladmin, request, pipeline.name, f"rewind done: {result.message}"
                           + (" The pipeline was resumed." if result.resumed else ""), ok=True)
            return None  # back to the changelist with one message per pipeline
        previews = []
        for pipeline in pipelines:
            try:
                previews.append({"pipeline": pipeline, "preview": rewind_ops.rewind(
                    pipeline, data["mode"], data["value"] or None, dry_run=True, **arguments).as_dict()})
            except Refused as exc:
                previews.append({"pipeline": pipeline, "refused": str(exc)})
        context.update(step="preview", previews=previews, carry=form.hidden_copy(),
                       rollback_sink=data["rollback_sink"],
                       executable=[p["pipeline"] for p in previews if "preview" in p])
    return intermediate_page(modeladmin, request, queryset, "admin/consumers/pipeline/rewind.html", "rewind",
                             "Rewind pipelines", context)


def log_invalid_form(pipelines, action: str, actor: str, form, *, dry_run: bool) -> None:
    """Bad input is a refusal like any other: one action log row per pipeline, with the form's errors."""
    params = {"via": "admin", **{k: form.data.get(k, "") for k in ("mode", "value", "partitions")}}
    for pipeline in pipelines:
        record_refusal(actor, action, f"Bad input: {form_errors(form)}", pipeline=pipeline, params=params,
                       dry_run=dry_run)


def intermediate_page(modeladmin, request, queryset, template: str, action: str, title: str, context: dict):
    opts = modeladmin.model._meta
    return TemplateResponse(request, template, {
        **modeladmin.admin_site.each_context(request), "title": title, "opts": opts, "action": action,
        "selected_ids": [str(pk) for pk in queryset.values_list("pk", flat=True)],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME, "media": modeladmin.media,
        "select_across": request.POST.get("select_across") == "1", **context})


# ---- dead letters: replay, discard (with a reason) ---------------------------------------------------

def _by_pipeline(queryset):
    grouped: dict = {}
    for letter in queryset.select_related("pipeline").order_by("pipeline__name", "partition", "offset"):
        grouped.setdefault(letter.pipeline, []).append(letter.pk)
    return grouped


def _act_on_letters(modeladmin, request, pipeline, action: str, ids, **kwargs):
    """Any number of a pipeline's dead letters (the admin's "select all" too), in audited batches of 1,000
    (consumers/operations/dead_letter_batches.py). Returns the outcome, or None after reporting why not."""
    ended = dead_letter_batches.attempt(action, lambda: dead_letter_batches.act_on_ids(
        pipeline, action, ids, actor=actor_of(request), **kwargs))
    if ended.refusal:
        report(modeladmin, request, pipeline.name, f"{action} refused: {ended.refusal}", ok=False)
    elif ended.stopped:
        report(modeladmin, request, pipeline.name, ended.stopped.message(), ok=False)
    elif ended.failed:   # the other pipelines still go on
        report(modeladmin, request, pipeline.name, ended.failed, ok=False)
    return ended.result


def _message(outcome) -> str:
    return outcome.done[0].message if len(outcome.done) == 1 else outcome.message()


# How each replay reads its records, on its confirmation page.
REPLAY_SOURCES = {"stored": "through the pipeline's current transform", "kafka": "re-read from Kafka"}


def _confirmed(modeladmin, request, queryset, action: str):
    """The selection of a confirmed replay or discard, grouped by pipeline; None after refusing (audited, per
    pipeline) one whose count is not the one its page showed: with "select all" the selection is the filtered list
    again, so dead letters that arrived since would be acted on unseen, as the page and API refuse too."""
    grouped = _by_pipeline(queryset)
    expected, selected = request.POST.get("expected", ""), sum(len(ids) for ids in grouped.values())
    refusal = _unconfirmed(expected, selected)
    if not refusal:
        return grouped
    params = {"via": "admin", "expected": expected[:20], "selected": selected,
              "select_across": request.POST.get("select_across") == "1"}
    for pipeline in grouped or [None]:
        record_refusal(request.user, action, refusal, pipeline=pipeline, params=params)
    modeladmin.message_user(request, refusal, messages.ERROR)
    return None


def _confirmation_page(modeladmin, request, queryset, template: str, action: str, title: str, context: dict):
    letters = list(queryset.select_related("pipeline").order_by("pipeline__name", "partition", "offset"))
    return intermediate_page(modeladmin, request, queryset, template, action, title, {"letters": letters, **context})


def _replay(modeladmin, request, queryset, source: str, action: str):
    """Intermediate page first, carrying the count it showed (see _confirmed)."""
    if request.POST.get("step") != "execute":
        return _confirmation_page(modeladmin, request, queryset, "admin/consumers/deadletter/replay.html", action,
                                  "Replay dead letters", {"source_text": REPLAY_SOURCES[source]})
    grouped = _confirmed(modeladmin, request, queryset, dead_letter_ops.REPLAY)
    for pipeline, ids in (grouped or {}).items():
        outcome = _act_on_letters(modeladmin, request, pipeline, "replay", ids, source=source)
        if outcome is not None:
            problems = {k for k in outcome.counts if k not in ("replayed", "already_in_sink")}
            report(modeladmin, request, pipeline.name, f"replay: {_message(outcome)}", ok=not problems)
    return None


@admin.action(description="Replay the selected dead letters through the current transform…", permissions=["operate"])
def replay_dead_letters(modeladmin, request, queryset):
    return _replay(modeladmin, request, queryset, "stored", "replay_dead_letters")


@admin.action(description="Replay the selected dead letters, re-reading the records from Kafka…",
              permissions=["operate"])
def replay_dead_letters_from_kafka(modeladmin, request, queryset):
    return _replay(modeladmin, request, queryset, "kafka", "replay_dead_letters_from_kafka")


@admin.action(description="Discard the selected dead letters (with a reason)…", permissions=["operate"])
def discard_dead_letters(modeladmin, request, queryset):
    """Intermediate page asking for the reason; consumers.operations.dead_letters refuses (and logs) an empty one.
    The page carries the count it showed (see _confirmed)."""
    if request.POST.get("step") != "execute":
        return _confirmation_page(modeladmin, request, queryset, "admin/consumers/deadletter/discard.html",
                                  "discard_dead_letters", "Discard dead letters",
                                  {"max_reason": dead_letter_ops.MAX_REASON})
    grouped = _confirmed(modeladmin, request, queryset, dead_letter_ops.DISCARD)
    for pipeline, ids in (grouped or {}).items():
        outcome = _act_on_letters(modeladmin, request, pipeline, "discard", ids, reason=request.POST.get("reason", ""))
        if outcome is not None:
            report(modeladmin, request, pipeline.name, _message(outcome), ok=True)
    return None


def _unconfirmed(expected: str, selected: int) -> str:
    """Why the confirmed replay or discard may not go on ("" when it may): the count its page showed is missing,
    or is no longer the number of dead letters selected."""
    if not (expected.isascii() and expected.isdigit()):
        return "The confirmation carries no count of dead letters: nothing was changed; choose the action again."
    if int(expected) != selected:
        return dead_letter_batches.count_moved(int(expected), selected, "are selected")
    return ""
