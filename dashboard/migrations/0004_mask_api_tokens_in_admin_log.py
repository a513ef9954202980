"""Django's admin log entries for API tokens written before the admin named tokens masked hold the key in clear:
their object_repr is str(token), the key (and an entry of the concrete Token model has the key as object_id too).
Name them as dashboard.admin.token_label does now: "API token abcd… of root".

The mask is copied here rather than imported: a migration must keep doing what it did when it was written, and
importing dashboard.admin would also run its admin registrations.

DRF's tokens (rest_framework.authtoken) have since given way to knox's and their app is no longer installed: their
table is read here by SQL when it is still there (dashboard 0005 drops it), and a database that never had it
has no such entries."""
from django.conf import settings
from django.db import migrations

PREFIX = "API token "
SHOWN_CHARS = 4   # dashboard.tokens.SHOWN_CHARS when this was written


def label(key: str, owner: str) -> str:
    shown = f"{PREFIX}{key[:SHOWN_CHARS]}…"
    return f"{shown} of {owner}" if owner else shown


def owner_of_key(connection, key: str):
    """The user id of the DRF token `key`, if its table is still there and holds it."""
    if "authtoken_token" not in connection.introspection.table_names():
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT user_id FROM authtoken_token WHERE key = %s", [key])
        row = cursor.fetchone()
    return row and row[0]


def mask_token_entries(apps, schema_editor):
    LogEntry = apps.get_model("admin", "LogEntry")
    ContentType = apps.get_model("contenttypes", "ContentType")
    User = apps.get_model(settings.AUTH_USER_MODEL)
    types = ContentType.objects.filter(app_label="authtoken", model__in=("token", "tokenproxy"))
    entries = LogEntry.objects.filter(content_type__in=types).exclude(object_repr__startswith=PREFIX)
    for entry in entries.iterator():
        key = entry.object_repr
        # A TokenProxy entry's object_id is its user's id; a Token entry's is the key itself. A revoked token's
        # owner is still found by that id; a revoked Token entry's owner is gone with it.
        user_id = owner_of_key(schema_editor.connection, key)
        if user_id is None and entry.object_id.isdigit():
            user_id = int(entry.object_id)
        owner = User.objects.filter(pk=user_id).values_list("username", flat=True).first() if user_id else None
        changes = {"object_repr": label(key, owner or "")}
        if key and entry.object_id == key:
            changes["object_id"] = f"{key[:SHOWN_CHARS]}…"
        LogEntry.objects.filter(pk=entry.pk).update(**changes)


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0003_alerts_app"),
        ("admin", "0003_logentry_add_action_flag_choices"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    # A masked key cannot be unmasked: going back leaves the entries as they are.
    operations = [migrations.RunPython(mask_token_entries, migrations.RunPython.noop)]
