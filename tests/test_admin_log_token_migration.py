"""dashboard/migrations/0004: the admin's log entries written before API tokens were named masked lose the key in
clear, the same way the admin names a token now (dashboard.admin.token_label). The migration's function is run
on real rows with the project's models (its historical models are the same ones)."""
import importlib

import pytest
from django.apps import apps
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from rest_framework.authtoken.models import Token, TokenProxy

from dashboard.admin import token_label
from tests.views_helpers import PASSWORD, make_operator

pytestmark = pytest.mark.django_db
migration = importlib.import_module("dashboard.migrations.0004_mask_api_tokens_in_admin_log")


def entry(obj_type, object_id, object_repr, flag=ADDITION, user=None):
    return LogEntry.objects.create(user=user, content_type=obj_type, object_id=str(object_id),
                                   object_repr=object_repr, action_flag=flag, change_message="[]")


def test_old_admin_log_entries_name_api_tokens_masked_after_the_migration_like_new_ones():
    root = User.objects.create_superuser("root", password=PASSWORD)
    operator = make_operator()
    kept, revoked = Token.objects.create(user=operator), Token.objects.create(user=root)
    revoked_key, old_key = revoked.key, "0123456789abcdef0123456789abcdef01234567"
    revoked.delete()
    proxy_type = ContentType.objects.get_for_model(TokenProxy, for_concrete_model=False)
    token_type = ContentType.objects.get_for_model(Token)
    made = entry(proxy_type, operator.pk, kept.key, user=root)          # made in the admin: object_id is the user's id
    gone = entry(proxy_type, root.pk, revoked_key, DELETION, user=root)  # revoked on Django's delete page
    concrete = entry(token_type, old_key, old_key, user=root)            # the concrete model's: the key is the id too
    already = entry(proxy_type, operator.pk, token_label(kept), user=root)
    a_user = entry(ContentType.objects.get_for_model(User), operator.pk, "otto", user=root)

    migration.mask_token_entries(apps, None)

    for row in (made, gone, concrete, already, a_user):
        row.refresh_from_db()
    assert made.object_repr == token_label(kept) == f"API token {kept.key[:4]}… of otto"
    assert gone.object_repr == f"API token {revoked_key[:4]}… of root"
    assert (concrete.object_repr, concrete.object_id) == ("API token 0123…", "0123…")
    assert already.object_repr == token_label(kept) and a_user.object_repr == "otto"
    stored = " ".join(f"{e.object_id} {e.object_repr} {e.change_message}" for e in LogEntry.objects.all())
    assert not any(key in stored for key in (kept.key, revoked_key, old_key))
    assert (made.object_id, gone.object_id) == (str(operator.pk), str(root.pk))
