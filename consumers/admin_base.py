"""The read-only admin every app's audit and protocol tables share."""
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and shows rows; never adds, changes or deletes them."""

    # These tables hold history (a ledger of millions of batches, every run, the audit trail): a list counts the
    # rows its filters keep once, and does not count the whole table again for "N of M selected".
    show_full_result_count = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class BoundedDatesChangeList(ChangeList):
    """A date hierarchy's year 9999 (its next year, the end of the range, is past datetime's last) answered 500
    from Django's own filters: it is a bad lookup, which the changelist answers by showing itself again (?e=1)."""

    def get_filters(self, request):
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class FormRefusalsAudited:
    """A model admin whose add and change forms, refused (the admin shows them again with their errors), write the
    refusal to the action log, as every other door does. `refused_as(object_id)`: the action it is logged as."""

    def refused_as(self, object_id) -> str:
        return "update" if object_id else "create"

    def refusal_params(self, request) -> dict:
        return {"via": "admin", "name": request.POST.get("name", "")[:200]}

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        from consumers.access import form_errors, record_refusal

        response = super().changeform_view(request, object_id, form_url, extra_context)
        shown = getattr(response, "context_data", None) or {}
        if request.method == "POST" and "adminform" in shown and shown["adminform"].form.errors:
            problems = form_errors(shown["adminform"].form)
            record_refusal(request.user, self.refused_as(object_id), f"bad input: {problems}",
                           params=self.refusal_params(request))
        return response
