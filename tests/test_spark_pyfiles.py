"""`make spark-pyfiles`: the zip that ships the project to executors on other hosts (`--py-files`)."""
import subprocess
import sys
import zipfile

from tests.conftest import ROOT


def test_the_pyfiles_zip_holds_the_packages_and_executors_import_the_commit_code_from_it(tmp_path):
    archive = tmp_path / "tally.zip"
    subprocess.run(["make", "-s", "spark-pyfiles", f"SPARK_PYFILES={archive}"], cwd=ROOT, check=True,
                   capture_output=True)

    names = set(zipfile.ZipFile(archive).namelist())
    assert {"consumers/engine/spark_commit.py", "consumers/engine/commit.py",
            "consumers/engine/spark_source.py", "tally/settings.py"} <= names
    # An executor's Python worker: the zip first on sys.path, no Django settings; the task code comes from it.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import consumers.engine.spark_commit as m; "
             "print(m.__file__)")
    found = subprocess.run([sys.executable, "-c", probe, str(archive)], cwd=tmp_path, check=True,
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout.strip()
    assert found.startswith(str(archive))
