"""Raw SQL names the project's own tables through their models (consumers/engine/tables.py), never in literals."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection
from psycopg2 import sql

from consumers.engine import tables
from consumers.models import BatchLedger, DeadLetter, PartitionOffset, Pipeline

ROOT = Path(__file__).resolve().parent.parent
APPS = ("consumers", "alerts", "dashboard", "tally")
# The one module allowed to spell table names: the commit protocol's, for Spark executors without Django.
SPELLED_HERE = ROOT / "consumers" / "engine" / "tables.py"


def own_tables() -> set[str]:
    return {model._meta.db_table for model in apps.get_models() if model.__module__.split(".")[0] in APPS}


def table_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every string constant (f-string parts included) that names one of `names`, except a
    model's own `db_table = "..."`: that is where the name comes from."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names))) + r")(?!\w)")
    tree = ast.parse(source)
    declared = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["db_table"]}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in declared
            and pattern.search(node.value)]


def application_modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts and path != SPELLED_HERE:
                yield path


def test_the_scan_finds_a_table_name_in_sql_and_in_an_f_string_but_not_in_an_admin_url_name():
    names = {"consumers_batchledger", "consumers_pipeline"}
    source = ('a = "SELECT 1 FROM consumers_batchledger WHERE id = %s"\n'
              'b = f"DELETE FROM consumers_pipeline WHERE id = {x}"\n'
              'c = "admin:consumers_pipeline_change"\n'
              'd = "public.consumers_pipelines"\n'
              'class Meta:\n    db_table = "consumers_pipeline"\n')
    assert [line for line, _ in table_literals(source, names)] == [1, 2]


def test_no_application_module_spells_one_of_its_tables_in_a_string():
    names = own_tables()
    assert {"consumers_batchledger", "consumers_partitionoffset", "consumers_deadletter"} <= names
    found = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}"
             for path in application_modules() for line, text in table_literals(path.read_text(), names)]
    assert found == [], "name tables with consumers.engine.tables.table(Model):\n" + "\n".join(found)


def test_the_commit_protocols_spelled_tables_are_its_models_tables():
    for identifier, model in ((tables.PIPELINE, Pipeline), (tables.PARTITION_OFFSET, PartitionOffset),
                              (tables.DEAD_LETTER, DeadLetter), (tables.BATCH_LEDGER, BatchLedger)):
        assert identifier == tables.table(model), model.__name__


def test_the_commit_protocol_still_imports_without_django():
    # Spark executors import it without Django settings: the spelled names exist for that reason only.
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    script = ("import sys, consumers.engine.spark_commit; "
              "print(sorted(m for m in sys.modules if m.startswith(('consumers.models', 'django.db'))))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.django_db
def test_a_django_cursor_runs_a_composed_statement_with_parameters():
    # Reconciliation and the operations run composed statements through Django's cursor wrapper.
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("SELECT count(*), %s FROM {} WHERE pipeline_id = %s").format(tables.table(BatchLedger)),
                       ["asked", -1])
        assert cursor.fetchone() == (0, "asked")
