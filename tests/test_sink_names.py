"""Sink tables are plain names in the allowed schema (TALLY_SINK_SCHEMA, default public); tables of Tally,
Django, installed apps and PostgreSQL are refused by name, before any column is looked at."""
import pytest
from django.db import connection

from consumers.engine.sink_names import name_problem, schema_problem
from consumers.operations.pipeline_setup import Invalid, PipelineSpec, validate


@pytest.mark.parametrize("table", ["public.auth_user", '"auth_user"', "auth user", "orders;drop", "1orders", "a" * 64])
def test_a_dotted_quoted_or_odd_name_is_refused(table):
    assert name_problem(table) is not None


@pytest.mark.parametrize("table,owner", [("auth_user", "auth.User"), ("knox_authtoken", "knox.AuthToken"),
                                         ("axes_accessattempt", "axes.AccessAttempt"),
                                         ("dashboard_mute", "alerts.Mute"), ("AUTH_USER", "auth.User"),
                                         ("consumers_pipeline", "consumers.Pipeline"),
                                         ("consumers_not_a_model_yet", "consumers_"), ("pg_class", "PostgreSQL"),
                                         ("django_session", "sessions.Session"),
                                         ("auth_user_groups", "auth.User_groups")])
def test_tables_of_tally_django_and_installed_apps_are_refused_by_name(table, owner):
    problem = name_problem(table)
    assert problem is not None and owner in problem, problem


@pytest.mark.parametrize("table", ["orders_sink", "Sink_2", "_private", "a" * 63, "admin_sink", "messages_in"])
def test_plain_names_of_no_app_are_accepted(table):
    assert name_problem(table) is None


@pytest.fixture
def elsewhere(db):
    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA elsewhere")
        cursor.execute("CREATE TABLE elsewhere.shadow (id bigint)")
        cursor.execute("SET search_path TO elsewhere, public")
    yield
    with connection.cursor() as cursor:
        cursor.execute("SET search_path TO DEFAULT")


def test_a_name_that_resolves_outside_the_allowed_schema_is_refused(elsewhere):
    with connection.cursor() as cursor:
        assert "resolves to elsewhere.shadow" in schema_problem(cursor, "shadow")
        assert "created in schema 'elsewhere'" in schema_problem(cursor, "brand_new")


def test_the_allowed_schema_is_a_setting(elsewhere, settings):
    settings.TALLY_SINK_SCHEMA = "elsewhere"
    with connection.cursor() as cursor:
        assert schema_problem(cursor, "shadow") is None and schema_problem(cursor, "brand_new") is None


def test_in_public_a_new_name_is_fine(db):
    with connection.cursor() as cursor:
        assert schema_problem(cursor, "brand_new_sink") is None


@pytest.mark.parametrize("table", ["auth_user", "public.auth_user", "knox_authtoken"])
def test_pipeline_setup_refuses_them_before_looking_at_columns(db, table):
    with pytest.raises(Invalid) as refused:
        validate(PipelineSpec(name="p", topic="", sink_table=table, create_table=True))
    assert "sink_table" in refused.value.problems
    assert "lacks" not in refused.value.problems["sink_table"]  # by name, not by missing columns
