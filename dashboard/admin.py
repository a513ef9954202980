"""API tokens in the admin (django-rest-knox's, which the database keeps as a digest and the key's first
characters): listed masked, never in clear. A token made here is shown once, in the message that confirms it;
after that only its first characters identify it. A token has no page of its own here, and Django's delete page
leads to a page of ours that revokes it, names it masked and writes the action log. Making and revoking a token
are in the action log, and so is every change of a user's role made in the admin: in the user admin (its groups,
permissions, superuser or active flag, or its deletion) and in the group admin (a group's permissions, or its
deletion, change its members' roles)."""
from django.contrib import admin, messages
from django.contrib.admin.models import LogEntry
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from knox.admin import AuthTokenCreateForm
from knox.models import AuthToken
from knox.settings import knox_settings

from consumers.access import AuditedRefusal, actor_of, record_refusal, role_of
from consumers.models import ActionLog, ActionResult
from dashboard.tokens import masked


def token_label(token: AuthToken) -> str:
    return f"API token {masked(token.token_key)} of {token.user.get_username()}"


admin.site.unregister(AuthToken)
admin.site.unregister(User)
admin.site.unregister(Group)


def _described(snapshot: dict) -> str:
    return (f"{snapshot['role']} (groups: {', '.join(snapshot['groups']) or 'none'}"
            f"{'; superuser' if snapshot['superuser'] else ''})")


NO_ROLE = {"role": "none", "groups": [], "superuser": False}


def role_snapshot(user_pk) -> dict:
    """What gives a user a role (consumers.access.role_of), read fresh: has_perm caches permissions on a User."""
    user = User.objects.filter(pk=user_pk).first()
    if user is None:  # deleted
        return NO_ROLE
    return {"role": role_of(user), "groups": sorted(user.groups.values_list("name", flat=True)),
            "superuser": user.is_superuser}


def log_role_changes(request, before: dict, why: str = "") -> None:
    """One "change_role" entry per user whose snapshot changed. `before`: {user pk: (username, snapshot)}."""
    for pk, (username, was) in before.items():
        now = role_snapshot(pk)
        if now != was:
            ActionLog.objects.create(
                action="change_role", actor=actor_of(request.user), result=ActionResult.DONE,
                params={"via": "admin", "user": username, "before": was, "after": now, **({"why": why} if why else {})},
                message=f"changed the role of {username}: {_described(was)} -> {_described(now)}"
                        + (f" ({why})" if why else ""),
                finished_at=timezone.now())


def snapshots(users) -> dict:
    return {user.pk: (user.get_username(), role_snapshot(user.pk)) for user in users}


@admin.register(User)
class TokenMaskingUserAdmin(UserAdmin):
    """Django's user admin, except that deleting a user lists its API tokens masked (Django names them by their
    digests), and a change of a user's role is written to the action log (who, which user, before and after)."""

    def save_model(self, request, obj, form, change):
        # Groups and permissions are saved after the row (save_related): the role before the change is read now.
        form.roles_before = snapshots([obj]) if change else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        before = form.roles_before or {form.instance.pk: (form.instance.get_username(), NO_ROLE)}
        log_role_changes(request, before)

    def delete_model(self, request, obj):
        before = snapshots([obj])
        super().delete_model(request, obj)
        log_role_changes(request, before, why="user deleted")

    def delete_queryset(self, request, queryset):
        before = snapshots(queryset)
        super().delete_queryset(request, queryset)
        log_role_changes(request, before, why="user deleted")

    def get_deleted_objects(self, objs, request):
        to_delete, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)
        keys = {str(token): token_label(token)
                for token in AuthToken.objects.filter(user__in=objs).select_related("user")}

        def mask(item):
            if isinstance(item, list):
                return [mask(inner) for inner in item]
            text = str(item)
            for key, label in keys.items():
                text = text.replace(key, label)
            return mark_safe(text) if isinstance(item, SafeString) else text  # noqa: S308 - Django's own HTML

        return mask(to_delete), model_count, perms_needed, protected


@admin.register(Group)
class RoleAuditingGroupAdmin(GroupAdmin):
    """Django's group admin; a change of a group's permissions, or its deletion, changes its members' roles: each
    member whose role changed gets a "change_role" entry naming the group."""

    def save_model(self, request, obj, form, change):
        form.roles_before = snapshots(obj.user_set.all()) if change else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        log_role_changes(request, form.roles_before, why=f"group {form.instance.name} changed")

    def delete_model(self, request, obj):
        before, name = snapshots(obj.user_set.all()), obj.name
        super().delete_model(request, obj)
        log_role_changes(request, before, why=f"group {name} deleted")

    def delete_queryset(self, request, queryset):
        before = snapshots(User.objects.filter(groups__in=queryset).distinct())
        names = ", ".join(sorted(queryset.values_list("name", flat=True)))
        super().delete_queryset(request, queryset)
        log_role_changes(request, before, why=f"group {names} deleted")


class NewTokenForm(AuthTokenCreateForm):
    """knox's form (the key made, its digest kept), for a user only: the token lives TALLY_API_TOKEN_TTL_DAYS, as
    one made by `POST /api/token`."""

    class Meta(AuthTokenCreateForm.Meta):
        fields = ["user"]

    def save(self, commit=True):
        token = super().save(commit=False)
        token.expiry = knox_settings.TOKEN_TTL and timezone.now() + knox_settings.TOKEN_TTL
        if commit:
            token.save()
        return token


@admin.register(AuthToken)
class MaskedTokenAdmin(admin.ModelAdmin):
    form = NewTokenForm
    list_display = ("masked_key", "user", "created", "expiry", "revoke_link")
    list_select_related = ("user",)
    fields = ("user",)
    search_fields = ("user__username",)
    ordering = ("-created",)

    @admin.display(description="key")
    def masked_key(self, obj):
        return masked(obj.token_key)

    def has_change_permission(self, request, obj=None):
        return False  # a token is made, never edited

    def has_view_permission(self, request, obj=None):
        return obj is None and super().has_view_permission(request, obj)

    def delete_view(self, request, object_id, extra_context=None):
        # Django's delete page writes no action log: revoking is ours. (The delete permission stays Django's, so
        # deleting a user, which takes its tokens with it, is not refused for them.)
        return redirect("admin:knox_authtoken_revoke", object_id)

    def get_actions(self, request):
        return {}  # no bulk delete: each token is revoked on its own page, audited

    @admin.display(description="revoke")
    def revoke_link(self, obj):
        url = reverse("admin:knox_authtoken_revoke", args=[obj.pk])
        return format_html('<a href="{}" class="tally-revoke">Revoke…</a>', url)

    def get_urls(self):
        # A token is named by its digest (its primary key): not the key, and of no use to authenticate.
        revoke = path("<str:digest>/revoke/", self.admin_site.admin_view(self.revoke_view),
                      name="knox_authtoken_revoke")
        return [revoke, *super().get_urls()]

    def can_revoke(self, request) -> bool:
        return self.has_delete_permission(request)  # Django's own delete permission on tokens (superusers have it)

    def revoke_view(self, request, digest: str):
        """GET: which token would be revoked (masked); POST: revoke it (delete it: it stops working at once)."""
        token = AuthToken.objects.select_related("user").filter(digest=digest).first()
        if not self.can_revoke(request):
            record_refusal(request.user, "revoke_token", f"{actor_of(request.user)} may not revoke API tokens",
                           params={"via": "admin", **({"user": token.user.get_username(),
                                                       "key": masked(token.token_key)} if token else {})})
            raise AuditedRefusal
        if token is None:
            self.message_user(request, "No such API token (revoked already, or expired?).", messages.WARNING)
            return redirect("admin:knox_authtoken_changelist")
        if request.method == "POST":
            owner, key = token.user.get_username(), masked(token.token_key)
            token.delete()
            ActionLog.objects.create(action="revoke_token", actor=actor_of(request.user), result=ActionResult.DONE,
                                     params={"via": "admin", "user": owner, "key": key},
                                     message=f"revoked the API token {key} of {owner}", finished_at=timezone.now())
            self.message_user(request, f"Revoked the API token {key} of {owner}: it no longer authenticates.",
                              messages.SUCCESS)
            return redirect("admin:knox_authtoken_changelist")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": "Revoke an API token",
                   "owner": token.user, "key": masked(token.token_key), "created": token.created,
                   "expiry": token.expiry}
        return TemplateResponse(request, "admin/knox/revoke_token.html", context)

    def log_addition(self, request, obj, message):
        # Django's LogEntry names the object by str(token), its digest: the entry names the token masked, as
        # the admin's "Recent actions" and a user's delete page show it.
        entry = super().log_addition(request, obj, message)
        LogEntry.objects.filter(pk=entry.pk).update(object_repr=token_label(obj))
        return entry

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        owner, key = obj.user.get_username(), masked(obj.token_key)
        ActionLog.objects.create(action="make_token", actor=actor_of(request.user), result=ActionResult.DONE,
                                 params={"via": "admin", "user": owner, "key": key},
                                 message=f"made the API token {key} of {owner}", finished_at=timezone.now())
        # The only time the key is known: knox keeps its digest.
        until = f"until {obj.expiry:%Y-%m-%d %H:%M} UTC" if obj.expiry else "until revoked"
        self.message_user(request, f"Token for {owner}: {form.token} ({until}) — copy it now: it is not shown "
                                   "again.", messages.WARNING)
