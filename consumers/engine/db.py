"""Raw psycopg2 connections for the engines' hot path (COPY, row locks, one transaction per batch)."""
import psycopg2
from django.conf import settings


def connect(application_name: str = "tally"):
    db = settings.DATABASES["default"]
    params = {"dbname": db["NAME"], "user": db.get("USER") or None, "password": db.get("PASSWORD") or None,
              "host": db.get("HOST") or None, "port": db.get("PORT") or None,
              "application_name": application_name}
    conn = psycopg2.connect(**{k: v for k, v in params.items() if v is not None})
    conn.autocommit = False
    return conn
