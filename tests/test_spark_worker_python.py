"""Spark's Python workers on this machine start through a launcher that drops Spark's pyspark.zip and py4j
zip from PYTHONPATH, so they import the installed PySpark (compiled once) instead of compiling the zip's
sources in every new worker; they run this interpreter with the rest of PYTHONPATH unchanged."""
import os
import subprocess
import sys

from consumers.engine import spark_session


def test_the_launcher_runs_this_interpreter_without_sparks_zips_on_the_path(tmp_path):
    launcher = spark_session.worker_python("local[*]")
    spark_session.install_worker_launcher(launcher)
    spark_session.install_worker_launcher(launcher)   # again: unchanged, still executable
    lib = "/opt/spark/python/lib"
    env = {**os.environ, "PYTHONPATH": f"{lib}/pyspark.zip:{tmp_path}:{lib}/py4j-0.10.9.9-src.zip"}
    shown = subprocess.run([launcher, "-c", "import os, sys, pyspark; print(os.environ['PYTHONPATH']); "
                            "print(sys.executable); print(pyspark.__file__)"],
                           env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[0] == str(tmp_path)
    assert shown[1] == sys.executable
    assert ".zip" not in shown[2]


def test_executors_on_other_hosts_run_the_plain_interpreter_path():
    assert spark_session.worker_python("spark://spark-master:7077") == sys.executable
