"""The Django admin's add, change and delete of pipelines go through consumers.operations.pipeline_setup, like
the command line, the dashboard's form and the pipelines file: the same validation (topic, sink table, names,
transform), the same rule on what may change (only the reading settings, only while stopped), and an action
log entry for every change. The admin adds no way of its own to write a Pipeline row."""
from django import forms
from django.contrib import messages
from django.shortcuts import redirect

from consumers.access import record_refusal
from consumers.form_errors import add_problems
from consumers.models import DeliveryMode, Pipeline
from consumers.operations import pipeline_setup
from consumers.operations.errors import DeleteRefused
from consumers.operations.pipeline_setup import COLUMNS, MUTABLE_FIELDS, Invalid, PipelineSpec

# Fields of the add form (the model's names).
ADD_FIELDS = ("name", "cluster", "topic", "sink_table", "delivery_mode", "transform", "group_id", "engine",
              "isolation_level", "on_log_truncated", "parallel_runs", "kafka_client")
# Settings the admin's forms do not show, kept as they are by a change.
KEPT_FIELDS = ("json_map", "upsert_key", "delete_on_tombstone")
# pipeline_setup names some fields differently from the model.
SPEC_TO_MODEL = {"mode": "delivery_mode", "group": "group_id", **COLUMNS}
# What a change may edit (pipeline_setup's rule), by the model's names.
CHANGE_FIELDS = tuple(SPEC_TO_MODEL.get(f, f) for f in MUTABLE_FIELDS)


class PipelineAdminForm(forms.ModelForm):
    create_table = forms.BooleanField(required=False, label="Create the sink table if it is missing")

    class Meta:
        model = Pipeline
        fields = ADD_FIELDS

    def __init__(self, *args, actor: str = "admin", **kwargs):
        super().__init__(*args, **kwargs)
        self.actor = actor
        if "group_id" in self.fields:
            self.fields["group_id"].required = False

    def spec(self) -> PipelineSpec:
        # A change starts from every stored setting (the JSON map and the upsert key included: a spec without
        # them would ask to drop them), then takes what the form edits.
        stored = ADD_FIELDS + KEPT_FIELDS if self.instance.pk else ()
        data = {**{f: getattr(self.instance, f) for f in stored}, **self.cleaned_data}
        return PipelineSpec(name=data["name"], topic=data["topic"], sink_table=data["sink_table"],
                            mode=DeliveryMode(data["delivery_mode"]).label, transform=data["transform"],
                            group=data.get("group_id") or "", engine=data["engine"],
                            isolation_level=data["isolation_level"], on_log_truncated=data["on_log_truncated"],
                            cluster=data["cluster"], runs=data["parallel_runs"],
                            kafka_client=data.get("kafka_client") or "",
                            create_table=bool(data.get("create_table")), map=data.get("json_map") or {},
                            upsert_key=list(data.get("upsert_key") or []),
                            delete_on_tombstone=bool(data.get("delete_on_tombstone")))

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            if self.instance.pk:
                pipeline_setup.check_update(self.spec(), self.instance)
            else:
                pipeline_setup.validate(self.spec())
        except Invalid as exc:
            add_problems(self, exc, renamed=SPEC_TO_MODEL)
        return cleaned


class PipelineAdminMixin:
    """ModelAdmin methods that route the admin's writes through pipeline_setup (audited, validated)."""

    form = PipelineAdminForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is not None:  # a change: only the reading settings, the others are shown read-only
            kwargs["fields"] = CHANGE_FIELDS
        form = super().get_form(request, obj, change=change, **kwargs)
        actor = request.user.get_username()

        class WithActor(form):
            def __init__(self, *args, **inner):
                super().__init__(*args, actor=actor, **inner)

        return WithActor

    def get_readonly_fields(self, request, obj=None):
        base = tuple(super().get_readonly_fields(request, obj))
        if obj is None:
            return base
        fixed = tuple(f for f in ADD_FIELDS if f not in CHANGE_FIELDS)
        return fixed + tuple(f for f in base if f not in fixed)

    def get_fields(self, request, obj=None):
        if obj is None:
            return [*ADD_FIELDS, "create_table"]
        return super().get_fields(request, obj)

    def save_model(self, request, obj, form, change):
        spec, actor = form.spec(), request.user.get_username()
        if change:
            pipeline_setup.update(spec, Pipeline.objects.get(pk=obj.pk), actor=actor)
            obj.refresh_from_db()
        else:
            created = pipeline_setup.create(spec, actor=actor)
            obj.pk, obj.id = created.pk, created.pk
            obj.refresh_from_db()

    def save_related(self, request, form, formsets, change):
        pass  # a pipeline has no related forms here; the model's own save() is never called

    def get_deleted_objects(self, objs, request):
        # The positions, ledger and dead letters go with their pipeline (pipeline_setup.delete): they are
        # read-only here, which must not make the admin refuse the pipeline's own delete.
        deleted, counts, _, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected

    def delete_model(self, request, obj):
        self.delete_queryset(request, [obj])

    def delete_queryset(self, request, queryset):
        """Each pipeline through pipeline_setup.delete; a refusal is audited and shown, and Django's "deleted
        successfully" that would follow it is held back (response_delete, message_user)."""
        for pipeline in queryset:
            try:
                pipeline_setup.delete(pipeline.name, actor=request.user.get_username())
            except DeleteRefused as exc:
                record_refusal(request.user, "delete", str(exc), params={"via": "admin", "pipeline": pipeline.name})
                messages.error(request, str(exc))
                request.tally_delete_refused = True

    def response_delete(self, request, obj_display, obj_id):
        if getattr(request, "tally_delete_refused", False):
            return redirect("admin:consumers_pipeline_changelist")
        return super().response_delete(request, obj_display, obj_id)

    def message_user(self, request, message, level=messages.INFO, *args, **kwargs):
        if level == messages.SUCCESS and getattr(request, "tally_delete_refused", False):
            return   # "Successfully deleted N pipelines": some were refused, each said so above
        super().message_user(request, message, level, *args, **kwargs)
