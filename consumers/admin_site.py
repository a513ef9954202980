"""Tally's admin site: Django's, plus the views for things without a model (consumer groups that Tally
does not run), listed on the index beside the models of the consumers app."""
import functools

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.apps import AdminConfig
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpResponseBadRequest
from django.urls import path, reverse


class TallyAdminSite(admin.AdminSite):
    site_header = "Tally administration"
    site_title = "Tally admin"

    def admin_view(self, view, cacheable=False):
        """Django's, with every refusal written to the action log, as at every other door: Django's own 403s (a
        viewer posting an add, change or delete form) say nothing anywhere else. A view that wrote its refusal
        already raises AuditedRefusal."""
        from consumers.access import AuditedRefusal, actor_of, record_refusal, refused_action

        inner = super().admin_view(view, cacheable)

        @functools.wraps(inner)
        def audited(request, *args, **kwargs):
            refusal = self._changelist_post_refusal(request)
            if refusal is not None:
                status, message = refusal
                record_refusal(request.user, refused_action(request, "admin"), message,
                               params={"via": "admin", "path": request.path, "method": request.method})
                if status == 403:
                    raise AuditedRefusal(message)
                return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")
            try:
                return inner(request, *args, **kwargs)
            except AuditedRefusal:
                raise
            except PermissionDenied as exc:
                record_refusal(request.user, refused_action(request, "admin"),
                               str(exc) or f"{actor_of(request.user)} has no permission for this in the admin",
                               params={"via": "admin", "path": request.path, "method": request.method})
                raise
        return audited

    def _changelist_post_refusal(self, request) -> tuple[int, str] | None:
        """A changelist POST that Django would answer with a 500 or refuse without a word: selected ids that are not
        whole numbers (Django filters the table by them: ValueError), or an action this user is not offered (Django
        says only "No action selected."). Actions for operators only are refused, per object, by the model admin's
        own check (OperatorActionsMixin, AlertAdmin)."""
        from consumers.access import actor_of
        from consumers.admin_actions import posted_action

        match = getattr(request, "resolver_match", None)
        if (request.method != "POST" or match is None or not (match.url_name or "").endswith("_changelist")
                or not self.has_permission(request)):   # not signed in to the admin: Django's login page answers
            return None
        model_admin = getattr(match.func, "model_admin", None)   # set by ModelAdmin.get_urls on its views
        if model_admin is None:
            return None
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if isinstance(model_admin.model._meta.pk, models.IntegerField) and not all(
                i.isascii() and i.isdigit() and len(i) <= 18 for i in selected):
            return 400, f"{helpers.ACTION_CHECKBOX_NAME}: the selected ids are whole numbers"
        action = posted_action(request)
        offered = model_admin.get_actions(request)
        if action and action not in offered and action not in getattr(model_admin, "operator_actions", ()):
            return 403, f"{actor_of(request.user)} may not run the action {action[:100]!r} here"
        return None

    def get_urls(self):
        from consumers import admin_groups, admin_history

        own = [
            path("consumers/history/", self.admin_view(lambda request: admin_history.history(request, self)),
                 name="history"),
            path("consumers/groups/", self.admin_view(lambda request: admin_groups.group_list(request, self)),
                 name="consumer_groups"),
            path("consumers/groups/reset/", self.admin_view(lambda request: admin_groups.group_reset(request, self)),
                 name="consumer_group_reset"),
        ]
        return own + super().get_urls()

    def get_app_list(self, request, app_label=None):
        from consumers.access import can_view

        apps = super().get_app_list(request, app_label)
        if can_view(request.user):
            for app in apps:
                if app["app_label"] == "consumers":
                    app["models"].append({"name": "Consumer groups (not run by Tally)", "object_name": "ConsumerGroup",
                                          "perms": {"view": True}, "admin_url": reverse("admin:consumer_groups"),
                                          "add_url": None, "view_only": True})
                    app["models"].append({"name": "History and retention", "object_name": "History",
                                          "perms": {"view": True}, "admin_url": reverse("admin:history"),
                                          "add_url": None, "view_only": True})
                    app["models"].sort(key=lambda model: model["name"].lower())
        return apps


class TallyAdminConfig(AdminConfig):
    default_site = "consumers.admin_site.TallyAdminSite"
