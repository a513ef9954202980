"""API tokens in the admin: listed masked, never in clear. A token made here is shown once, in the message
that confirms it; after that only its first characters identify it. A token has no page of its own here (its
name is its key, which Django's object pages print in their titles)."""
from django.contrib import admin, messages
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

SHOWN_CHARS = 4


def masked(key: str) -> str:
    return f"{key[:SHOWN_CHARS]}…" if key else ""


admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class MaskedTokenAdmin(TokenAdmin):
    list_display = ("masked_key", "user", "created")
    fields = ("user",)
    search_fields = ("user__username",)
    ordering = ("-created",)

    @admin.display(description="key")
    def masked_key(self, obj):
        return masked(obj.key)

    def has_change_permission(self, request, obj=None):
        return False  # a token is made, never edited

    def has_view_permission(self, request, obj=None):
        return obj is None and super().has_view_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False  # Django's confirmation page names the object: its key

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        self.message_user(request, f"Token for {obj.user}: {obj.key} — copy it now: it is not shown again.",
                          messages.WARNING)
