"""Create the configured PostgreSQL database if it does not exist (used by `make run` / `make test`)."""
import psycopg2
from django.conf import settings
from django.core.management.base import BaseCommand
from psycopg2 import sql


class Command(BaseCommand):
    help = "Create the PostgreSQL database named in DATABASE_URL when it is missing."

    def handle(self, *args, **options):
        db = settings.DATABASES["default"]
        params = {"dbname": "postgres", "user": db.get("USER") or None, "password": db.get("PASSWORD") or None,
                  "host": db.get("HOST") or None, "port": db.get("PORT") or None}
        conn = psycopg2.connect(**{k: v for k, v in params.items() if v is not None})
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
            if cur.fetchone():
                self.stdout.write(f"Database {db['NAME']} exists.")
            else:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
                self.stdout.write(f"Created database {db['NAME']}.")
        conn.close()
