# Tally — the README's two commands: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Some machines set PYTHONDONTWRITEBYTECODE: every test process (and every command or server a test starts)
# then compiles the project from source again, and pytest rewrites every test module's asserts again. The
# caches go to __pycache__, which git ignores.
unexport PYTHONDONTWRITEBYTECODE
# apt packages the tests need: Chromium for browser tests, the PostgreSQL JDBC jar for Spark.
APT_PACKAGES := chromium libpostgresql-jdbc-java

.PHONY: run test test-fast test-clock setup system-deps database lint screenshots spark-pyfiles clean

run: setup database
	$(PY) manage.py devstack

# Most integration tests wait on a broker, a worker or a browser rather than on the CPU, so they run in
# TEST_WORKERS pytest-xdist workers (each with its own test database, Redis database and broker); the Spark
# tests run in three groups of their own, a worker and at most one JVM in the test process each (--dist
# loadgroup, tests/conftest.py::spark_group), and two workers take the rest. TEST_WORKERS=0 runs them serially.
TEST_WORKERS ?= 5
# --durations: every run's log names its slowest tests, where the suite's time goes.
test: setup system-deps database
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-clock

# Every test that needs no broker, Celery worker, Spark or browser: run it before every commit. In four
# pytest-xdist workers: on 2 cores two left a core idle a third of the time (tests wait on PostgreSQL, a
# subprocess or a refused connection), four were the fastest (docs/benchmarks.md; TEST_FAST_WORKERS=0: serially).
# It keeps each worker's test database for the next run (--reuse-db), which still applies new migrations; after
# editing an existing migration, run it once with PYTEST_ARGS=--create-db. Tests need no development database.
FAST_MARKERS := not kafka and not celery and not spark and not browser and not chaos and not install
TEST_FAST_WORKERS ?= 4
test-fast: setup
	$(VENV)/bin/pytest -n $(TEST_FAST_WORKERS) --dist worksteal --reuse-db -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# The fast lane with the clock a year ahead and a year back: no test may depend on today's date. `make test` ends
# with it, so CI checks that rule too.
CLOCK_PYTEST = $(VENV)/bin/pytest -q -n $(TEST_FAST_WORKERS) --dist worksteal --reuse-db -m "$(FAST_MARKERS)"
test-clock: setup
	TALLY_TEST_CLOCK_SHIFT_DAYS=365 $(CLOCK_PYTEST) $(PYTEST_ARGS)
	TALLY_TEST_CLOCK_SHIFT_DAYS=-365 $(CLOCK_PYTEST) $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Installs only what is missing; needs root (CI and dev machines run as root) or sudo.
system-deps:
	@missing=""; \
	for pkg in $(APT_PACKAGES); do dpkg -s $$pkg >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

database: setup
	$(PY) manage.py ensure_database
	$(PY) manage.py migrate --noinput -v 0

# Refresh the README's screenshots from the browser tests.
screenshots: setup system-deps database
	TALLY_UPDATE_SCREENSHOTS=1 $(VENV)/bin/pytest -m browser

# The project's Python packages as one zip for Spark executors on other hosts (`--py-files` or
# `spark.submit.pyFiles`): the tasks import consumers.engine.spark_commit there. Built from the committed tree (git archive),
# so the zip is exactly what a commit holds. Compiled dependencies (psycopg2, crc32c, pyarrow) cannot live in
# a zip: install them on the executors (docs/spark.md).
SPARK_PYFILES := dist/tally-spark-pyfiles.zip
SPARK_PACKAGES := consumers tally dashboard alerts
spark-pyfiles:
	mkdir -p dist
	git archive --format=zip -o $(SPARK_PYFILES) HEAD $(SPARK_PACKAGES)
	@echo "$(SPARK_PYFILES): pass it with --py-files or spark.submit.pyFiles"

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) var/*.log
