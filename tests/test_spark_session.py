"""The one SparkSession per process: built from settings, reused, and never handed across a fork."""
import os
import sys

import pytest

from consumers.engine import spark_session as session
from consumers.engine.spark_session import SparkSessionError, get_spark

pytestmark = pytest.mark.spark


def test_the_session_config_comes_from_settings(settings):
    settings.SPARK_DRIVER_MEMORY = "3g"
    local = session.session_config("local[2]")
    assert (local["spark.driver.memory"], local["spark.pyspark.python"], local["spark.pyspark.driver.python"]) == (
        "3g", session.worker_python("local[2]"), sys.executable)
    assert local["spark.jars"] == settings.SPARK_JDBC_JAR and os.path.isfile(local["spark.jars"])
    assert (local["spark.ui.enabled"], local["spark.sql.shuffle.partitions"], local["spark.driver.host"]) == (
        "false", "4", "127.0.0.1")
    cluster = session.session_config("spark://master:7077")
    assert cluster["spark.pyspark.python"] == sys.executable   # another host has no launcher of ours
    assert "spark.driver.host" not in cluster and "spark.sql.shuffle.partitions" not in cluster


def test_a_cluster_on_this_machine_gets_a_driver_on_the_loopback_address():
    for master in ("spark://127.0.0.1:7077", "spark://localhost:7077"):
        config = session.session_config(master)
        assert (config["spark.driver.host"], config["spark.driver.bindAddress"]) == ("127.0.0.1", "127.0.0.1")
        assert "spark.sql.shuffle.partitions" not in config  # Spark's cluster defaults apply


def test_a_missing_jdbc_jar_is_left_out_instead_of_failing_the_start(settings, tmp_path):
    settings.SPARK_JDBC_JAR = str(tmp_path / "absent.jar")
    assert "spark.jars" not in session.session_config("local[2]")


def test_one_session_per_process_with_the_jdbc_jar_and_the_kafka_source(settings):
    spark = get_spark()
    assert get_spark() is spark
    assert spark.conf.get("spark.jars") == settings.SPARK_JDBC_JAR
    assert spark.sparkContext.pythonExec == session.worker_python(settings.SPARK_MASTER)
    # Its Python workers run this interpreter and import the installed PySpark, not the sources in Spark's zip.
    python, pyspark_file = spark.range(1).rdd.map(lambda _: (sys.executable, __import__("pyspark").__file__)).first()
    assert python == sys.executable and ".zip" not in pyspark_file
    # The Data Source is registered: a read of it plans without a broker (it fails on the options instead).
    with pytest.raises(Exception, match="kafka.bootstrap.servers and subscribe are required"):
        spark.read.format("tally_kafka").load().collect()


def test_a_forked_child_is_refused_the_parents_session():
    get_spark()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a Celery prefork pool process would be here
        try:
            get_spark()
            os.write(write_end, b"used")
        except SparkSessionError:
            os.write(write_end, b"refused")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    os.close(write_end)
    assert os.read(read_end, 16) == b"refused"


def test_local_masters_retry_failed_tasks_as_a_cluster_does():
    assert session.with_task_retries("local[*]") == "local[*,8]"
    assert session.with_task_retries("local[2]") == "local[2,8]"
    assert session.with_task_retries("local") == "local[1,8]"
    assert session.with_task_retries("local[2,1]") == "local[2,1]"  # chosen explicitly: kept
    assert session.with_task_retries("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"
    assert session.session_config("spark://127.0.0.1:7077")["spark.task.maxFailures"] == str(session.TASK_ATTEMPTS)
