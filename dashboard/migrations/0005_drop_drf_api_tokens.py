"""DRF's API tokens (rest_framework.authtoken) kept each key in clear, as the table's primary key. Tally's tokens
are knox's now (a digest each), the old ones no longer authenticate, and their app is no longer installed: drop
their table, so no database or backup keeps those keys, and forget the app's migrations, so that installing it
again would create its table instead of taking it as there."""
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("dashboard", "0004_mask_api_tokens_in_admin_log"),
        ("knox", "0009_extend_authtoken_field"),
    ]
    # Going back cannot bring the keys back: old tokens stay gone (make new ones).
    operations = [migrations.RunSQL(["DROP TABLE IF EXISTS authtoken_token",
                                     "DELETE FROM django_migrations WHERE app = 'authtoken'"],
                                    migrations.RunSQL.noop)]
