"""dashboard/migrations/0004: the admin's log entries written before API tokens were named masked lose the key in
clear, the same way the admin names a token ("API token abcd… of otto"). DRF's token app is no longer installed
(the tokens are knox's), so its table is made here as it was, and the migration's function is run on real rows
of it; dashboard/migrations/0005 then drops that table."""
import importlib

import pytest
from django.apps import apps
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from tests.views_helpers import PASSWORD, make_operator

pytestmark = pytest.mark.django_db
migration = importlib.import_module("dashboard.migrations.0004_mask_api_tokens_in_admin_log")
drop = importlib.import_module("dashboard.migrations.0005_drop_drf_api_tokens")

KEPT, REVOKED, OLD = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678", "f" * 40, "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def drf_tokens():
    """DRF's token table as rest_framework.authtoken made it (its key the primary key, in clear)."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz NOT NULL, "
                       "user_id integer NOT NULL UNIQUE REFERENCES auth_user (id))")


def entry(obj_type, object_id, object_repr, flag=ADDITION, user=None):
    return LogEntry.objects.create(user=user, content_type=obj_type, object_id=str(object_id),
                                   object_repr=object_repr, action_flag=flag, change_message="[]")


def test_old_admin_log_entries_name_api_tokens_masked_after_the_migration_like_new_ones(drf_tokens):
    root = User.objects.create_superuser("root", password=PASSWORD)
    operator = make_operator()
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [KEPT, operator.pk])
    proxy_type = ContentType.objects.get_or_create(app_label="authtoken", model="tokenproxy")[0]
    token_type = ContentType.objects.get_or_create(app_label="authtoken", model="token")[0]
    made = entry(proxy_type, operator.pk, KEPT, user=root)          # made in the admin: object_id is the user's id
    gone = entry(proxy_type, root.pk, REVOKED, DELETION, user=root)  # revoked on Django's delete page
    concrete = entry(token_type, OLD, OLD, user=root)               # the concrete model's: the key is the id too
    kept_by_key = entry(token_type, KEPT, KEPT, user=root)          # its owner found by the key in the old table
    already = entry(proxy_type, operator.pk, "API token a1b2… of otto", user=root)
    a_user = entry(ContentType.objects.get_for_model(User), operator.pk, "otto", user=root)

    with connection.schema_editor() as editor:
        migration.mask_token_entries(apps, editor)

    for row in (made, gone, concrete, kept_by_key, already, a_user):
        row.refresh_from_db()
    assert made.object_repr == "API token a1b2… of otto"
    assert gone.object_repr == "API token ffff… of root"
    assert (concrete.object_repr, concrete.object_id) == ("API token 0123…", "0123…")
    assert (kept_by_key.object_repr, kept_by_key.object_id) == ("API token a1b2… of otto", "a1b2…")
    assert already.object_repr == "API token a1b2… of otto" and a_user.object_repr == "otto"
    stored = " ".join(f"{e.object_id} {e.object_repr} {e.change_message}" for e in LogEntry.objects.all())
    assert not any(key in stored for key in (KEPT, REVOKED, OLD))
    assert (made.object_id, gone.object_id) == (str(operator.pk), str(root.pk))


def test_the_old_token_table_and_its_keys_are_dropped(drf_tokens):
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [KEPT, make_operator().pk])
    with connection.schema_editor() as editor:
        for operation in drop.Migration.operations:
            operation.database_forwards("dashboard", editor, None, None)
    assert "authtoken_token" not in connection.introspection.table_names()
    with connection.schema_editor() as editor:   # a database that never had it
        for operation in drop.Migration.operations:
            operation.database_forwards("dashboard", editor, None, None)
