"""The Django admin's add, change and delete of pipelines go through consumers.operations.pipeline_setup, like
the command line, the dashboard's form and the pipelines file: the same validation (topic, sink table, names,
transform), the same rule on what may change (only the reading settings, only while stopped), and an action
log entry for every change. The admin adds no way of its own to write a Pipeline row."""
from django import forms
from django.contrib import messages

from consumers.form_errors import add_problems
from consumers.models import DeliveryMode, Pipeline
from consumers.operations import pipeline_setup
from consumers.operations.pipeline_setup import COLUMNS, MUTABLE_FIELDS, Invalid, PipelineSpec

# Fields of the add form (the model's names).
ADD_FIELDS = ("name", "cluster", "topic", "sink_table", "delivery_mode", "transform", "group_id", "engine",
              "isolation_level", "on_log_truncated", "parallel_runs", "kafka_client")
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
        data = {**{f: getattr(self.instance, f) for f in ADD_FIELDS if self.instance.pk}, **self.cleaned_data}
        return PipelineSpec(name=data["name"], topic=data["topic"], sink_table=data["sink_table"],
                            mode=DeliveryMode(data["delivery_mode"]).label, transform=data["transform"],
                            group=data.get("group_id") or "", engine=data["engine"],
                            isolation_level=data["isolation_level"], on_log_truncated=data["on_log_truncated"],
                            cluster=data["cluster"], runs=data["parallel_runs"],
                            kafka_client=data.get("kafka_client") or "",
                            create_table=bool(data.get("create_table")))

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
        try:
            pipeline_setup.delete(obj.name, actor=request.user.get_username())
        except pipeline_setup.DeleteRefused as exc:
            messages.error(request, str(exc))

    def delete_queryset(self, request, queryset):
        for pipeline in queryset:
            self.delete_model(request, pipeline)
