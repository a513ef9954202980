"""The read-only admin every app's audit and protocol tables share."""
from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Lists and shows rows; never adds, changes or deletes them."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
