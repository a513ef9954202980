"""The read-only admin every app's audit and protocol tables share."""
from django.contrib import admin


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
