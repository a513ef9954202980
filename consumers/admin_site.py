"""Tally's admin site: Django's, plus the views for things without a model (consumer groups that Tally
does not run), listed on the index beside the models of the consumers app."""
from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.urls import path, reverse


class TallyAdminSite(admin.AdminSite):
    site_header = "Tally administration"
    site_title = "Tally admin"

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
