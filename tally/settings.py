"""Tally settings. Every deployment-specific value comes from the environment (see README)."""
import os
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from tally.env import (
    env_bool,
    env_bootstrap_servers,
    env_choice,
    env_database,
    env_email,
    env_int,
    env_list,
    env_path,
    env_rate,
    env_request_header_pair,
    env_secret,
    env_str,
    env_url,
    env_web_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Development (manage.py from a checkout, `make run`, the tests) may run without a SECRET_KEY; anything
# else (gunicorn, Celery in the Docker image, which sets TALLY_DEVELOPMENT=0) must be given one.
# DEBUG is off unless asked for: the developer stack (`manage.py devstack`) turns it on for its web server.
TALLY_DEVELOPMENT = env_bool("TALLY_DEVELOPMENT", False)
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    if not (TALLY_DEVELOPMENT or DEBUG):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("Environment variable SECRET_KEY must be set outside development "
                                   "(see docs/security.md).")
    SECRET_KEY = "dev-only-insecure-key-change-me"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
if not ALLOWED_HOSTS and not DEBUG:
    # Django would answer every request 400 (DisallowedHost) without saying why: say it at start-up.
    raise ImproperlyConfigured("Environment variable ALLOWED_HOSTS is empty: expected the host names Tally is "
                               "served under, comma-separated (see docs/security.md).")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (docs/security.md "Production settings"): secure by default outside development -------------
_SECURE = not (TALLY_DEVELOPMENT or DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _SECURE)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _SECURE)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _SECURE)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if _SECURE else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", _SECURE)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)  # a commitment to browsers' lists: opt in
# Behind a TLS-terminating proxy: "HTTP_X_FORWARDED_PROTO,https". Only set it when the proxy always sets
# (and strips) that header, or a client could claim HTTPS.
SECURE_PROXY_SSL_HEADER = env_request_header_pair("SECURE_PROXY_SSL_HEADER")
SESSION_COOKIE_HTTPONLY = True

INSTALLED_APPS = [
    "consumers.admin_site.TallyAdminConfig",  # django.contrib.admin with the consumer-group views
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "knox",  # API tokens, stored as digests (REST_KNOX below)
    "drf_spectacular",
    "consumers",
    "dashboard",
    "alerts",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files with DEBUG off, from the app server
    "dashboard.middleware.RejectNulCharactersMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "dashboard.middleware.RequireRoleMiddleware",  # a signed-in user without a role sees only a page saying so
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]

ROOT_URLCONF = "tally.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.security",
            ],
        },
    },
]
WSGI_APPLICATION = "tally.wsgi.application"
ASGI_APPLICATION = "tally.asgi.application"

DATABASES = {"default": env_database("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tally")}
# Parallel test runs (e.g. several developers' sessions on one server) need distinct test databases.
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_" + DATABASES["default"]["NAME"])}
DATABASES["default"].setdefault("CONN_MAX_AGE", 0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Failed logins (the login form, the admin and the API's token endpoint) are counted per user name and
# address by django-axes: after AXES_FAILURE_LIMIT failures that pair is locked out for AXES_COOLOFF_HOURS.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_int("AXES_COOLOFF_MINUTES", 15, minimum=1) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "dashboard.lockout.locked_out"
# Behind a proxy, the client address comes from X-Forwarded-For (set AXES_IPWARE_PROXY_COUNT to the
# number of proxies); by default the socket's address.
# The API's throttles read the same count (REST_FRAMEWORK["NUM_PROXIES"] below), and lockouts take the throttles'
# address (AXES_CLIENT_IP_CALLABLE): with 0, X-Forwarded-For is ignored everywhere, so a made-up header changes
# neither a lockout nor a throttle.
AXES_IPWARE_PROXY_COUNT = env_int("AXES_IPWARE_PROXY_COUNT", 0, minimum=0)
# The user name axes stores (its column holds 255 characters): cut and made storable, so a long or odd
# name is a failed login like any other, never a database error.
AXES_USERNAME_CALLABLE = "dashboard.lockout.client_username"
AXES_CLIENT_IP_CALLABLE = "dashboard.lockout.client_address"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# JSON API (dashboard/api/): session auth for the browser, token auth for scripts; JSON only.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication",
                                       "dashboard.tokens.TokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "consumers.api_base.HasRole"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": None,
    # Bodies are bounded in size and depth, and strings PostgreSQL cannot store are refused (a 4xx, not a 500).
    "DEFAULT_PARSER_CLASSES": ["dashboard.api.parsers.BoundedJSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "EXCEPTION_HANDLER": "dashboard.api.parsers.audited_exception_handler",   # audits refused bodies
    # Throttles key on the client's address: X-Forwarded-For counts only behind that many trusted proxies.
    "NUM_PROXIES": AXES_IPWARE_PROXY_COUNT,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Requests per user (signed in) or per address (anonymous): a leaked token or a script gone wrong
    # cannot hammer Kafka and the database; the token endpoint has its own stricter scope.
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle",
                                 "rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": env_rate("API_THROTTLE_ANON", "60/min"),
                               "user": env_rate("API_THROTTLE_USER", "600/min"),
                               "token": env_rate("API_THROTTLE_TOKEN", "10/min")},
}
# API tokens (django-rest-knox): each `POST /api/token` or one made in the admin is a new token, shown once; the
# database keeps its digest and first characters. It lives TALLY_API_TOKEN_TTL_DAYS (0: until revoked).
TALLY_API_TOKEN_TTL_DAYS = env_int("TALLY_API_TOKEN_TTL_DAYS", 90, minimum=0)
# Live tokens per user that `POST /api/token` makes (0: no limit): past it, 409 until one is revoked or expires, so
# a script asking for a token at every run, or a leaked password, cannot pile up tokens that work for months.
TALLY_API_TOKEN_LIMIT = env_int("TALLY_API_TOKEN_LIMIT", 10, minimum=0)
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=TALLY_API_TOKEN_TTL_DAYS) if TALLY_API_TOKEN_TTL_DAYS else None,
    "TOKEN_LIMIT_PER_USER": TALLY_API_TOKEN_LIMIT or None,
    "AUTH_HEADER_PREFIX": "Token",   # `Authorization: Token <key>`, as before
    "AUTO_REFRESH": False,           # a token used every day still expires: scripts are given a new one
}
# The largest JSON body the API reads (the largest real one, 1,000 dead-letter ids, is about 20 KB).
TALLY_MAX_BODY_BYTES = env_int("TALLY_MAX_BODY_BYTES", 1_048_576, minimum=1024)
SPECTACULAR_SETTINGS = {
    "TITLE": "Tally API",
    "DESCRIPTION": "Pipelines, reconciliation, consumer groups and operator actions. Session or token auth; "
                   "viewers read, operators act.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated", "consumers.api_base.HasRole"],
}


STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# WhiteNoise serves STATIC_ROOT (filled by `collectstatic`, as the Docker image does); in development it
# serves straight from the source folders, finding each file when it is asked for. (Without autorefresh it would
# list every static file of every app whenever its middleware is built: once per test client, about 0.08 s.)
WHITENOISE_USE_FINDERS = TALLY_DEVELOPMENT or DEBUG
WHITENOISE_AUTOREFRESH = WHITENOISE_USE_FINDERS
STORAGES = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"}}

# --- Kafka -------------------------------------------------------------------------------------------
KAFKA_BOOTSTRAP_SERVERS = env_bootstrap_servers("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
# Real Kafka refuses sessions below group.min.session.timeout.ms (6 s by default): never shorter, here
# or in tests. Only the classic modes join a group; exactly-once runs take partitions from the database
# (consumers/engine/shares.py), so their restarts wait for no join.
KAFKA_SESSION_TIMEOUT_MS = env_int("KAFKA_SESSION_TIMEOUT_MS", 6000, minimum=6000)
KAFKA_REQUEST_TIMEOUT_MS = env_int("KAFKA_REQUEST_TIMEOUT_MS", 30000, minimum=1000)
# TLS and SASL of the default cluster, named as kafka-python and librdkafka users expect; checked as a whole
# by consumers/kafka/clusters.py. Secrets are read when a client is built, never kept here:
# KAFKA_SASL_PASSWORD / KAFKA_SSL_PASSWORD from the environment, or the files named by their _FILE twins.
# Relative file paths are relative to the project directory, the same in every process (env_path).
KAFKA_SECURITY_PROTOCOL = env_choice("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT",
                                     ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"))
KAFKA_SSL_CAFILE = env_path("KAFKA_SSL_CAFILE", BASE_DIR)
KAFKA_SSL_CERTFILE = env_path("KAFKA_SSL_CERTFILE", BASE_DIR)
KAFKA_SSL_KEYFILE = env_path("KAFKA_SSL_KEYFILE", BASE_DIR)
KAFKA_SSL_PASSWORD_FILE = env_path("KAFKA_SSL_PASSWORD_FILE", BASE_DIR)
KAFKA_SSL_CHECK_HOSTNAME = env_bool("KAFKA_SSL_CHECK_HOSTNAME", True)
KAFKA_SASL_MECHANISM = env_choice("KAFKA_SASL_MECHANISM", "",
                                  ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"))
KAFKA_SASL_USERNAME = env_str("KAFKA_SASL_USERNAME", "")
KAFKA_SASL_PASSWORD_FILE = env_path("KAFKA_SASL_PASSWORD_FILE", BASE_DIR)
KAFKA_SASL_OAUTH_TOKEN_FILE = env_path("KAFKA_SASL_OAUTH_TOKEN_FILE", BASE_DIR)
# More clusters: a TOML file with one [clusters.NAME] table each (docs/deploy.md).
TALLY_KAFKA_CLUSTERS = env_path("TALLY_KAFKA_CLUSTERS", BASE_DIR)
# The Python engine's Kafka client for pipelines that leave it to the worker (Pipeline.kafka_client empty):
# kafka-python (the design's), or librdkafka (confluent-kafka, the extra tally[rdkafka]: decodes outside the GIL).
TALLY_KAFKA_CLIENT = env_choice("TALLY_KAFKA_CLIENT", "KAFKA-PYTHON", ("KAFKA-PYTHON", "LIBRDKAFKA")).lower()

# --- Redis / Celery ----------------------------------------------------------------------------------
REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:6379/0", ("redis", "rediss", "unix"))
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker reserves only the tasks it can start: a pipeline's run waits in Redis, where another worker can take
# it, rather than behind the runs that fill this one (the default, 4 per thread, kept them there silently).
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# The multiplier alone does not do it: a run task is acknowledged when it starts, which frees its prefetch slot, so
# a full worker reserved the next run and held it behind its own (Celery's prefetch counts unacknowledged tasks, not
# busy threads). With this a worker on Redis fetches only while it has a free thread.
CELERY_WORKER_DISABLE_PREFETCH = True
# A task a worker took and died with (SIGKILL, a lost machine) before starting it stays unacknowledged in Redis
# until the visibility timeout, then goes back to the queue. Every task is acknowledged as it starts (no acks_late,
# no ETA), and a worker takes one only with a thread free, so a task is unacknowledged for a moment only: the
# timeout can be minutes, not Redis's default hour, during which the supervisor waits for that task and the
# pipeline stands still. The sweep for such tasks runs every 10 s in each worker.
TALLY_TASK_REDELIVERY_SECONDS = env_int("TALLY_TASK_REDELIVERY_SECONDS", 300, minimum=5)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": TALLY_TASK_REDELIVERY_SECONDS,
                                   "unacked_restore_interval": 10, "unacked_restore_throttle": 1}
# Periodic work (supervisor, reconciliation, snapshots, alerts). Each area adds its entry here.
CELERY_BEAT_SCHEDULE: dict[str, dict] = {}

# --- Operating layer: runs, supervisor (consumers/operations/supervisor.py) ---------------------------------------
# Sink tables live in this schema, by plain name; one resolving elsewhere is refused (consumers/engine/sink_names.py).
TALLY_SINK_SCHEMA = env_str("TALLY_SINK_SCHEMA", "public")
# A run whose heartbeat (written about every second) is older than the lease is considered dead.
TALLY_RUN_LEASE_SECONDS = env_int("TALLY_RUN_LEASE_SECONDS", 15, minimum=2)
# PostgreSQL ends an engine transaction that waits this long for its process (frozen, cut off), so its locks do not
# block restarts, stops and rewinds for ever. Well above a lease: a batch's transform runs inside its transaction,
# and a slow one must not be cut off. 0: no limit.
TALLY_ENGINE_IDLE_TRANSACTION_SECONDS = env_int("TALLY_ENGINE_IDLE_TRANSACTION_SECONDS", 120, minimum=0)
# A run whose poll loop has not turned for this long is stuck (a transform call that never returns): its process's beat
# stops heartbeating it and declares it crashed, so the supervisor restarts the pipeline (consumers/engine/beat.py).
# Above the idle-transaction limit: a transform runs inside its batch's transaction, so one slower than that could not
# commit anyway, and PostgreSQL has ended that transaction (and freed the pipeline row the restart's epoch bump
# waits for) by then. 0: never.
TALLY_RUN_STALL_SECONDS = env_int("TALLY_RUN_STALL_SECONDS", TALLY_ENGINE_IDLE_TRANSACTION_SECONDS + 60, minimum=0)
if 0 < TALLY_RUN_STALL_SECONDS <= TALLY_ENGINE_IDLE_TRANSACTION_SECONDS:
    raise ImproperlyConfigured("TALLY_RUN_STALL_SECONDS must be above TALLY_ENGINE_IDLE_TRANSACTION_SECONDS (or 0): a "
                               "transform within that limit can still commit and must not be declared stuck.")
TALLY_SUPERVISOR_INTERVAL_SECONDS = env_int("TALLY_SUPERVISOR_INTERVAL_SECONDS", 5, minimum=1)
TALLY_SUPERVISOR_BACKOFF_SECONDS = env_int("TALLY_SUPERVISOR_BACKOFF_SECONDS", 5, minimum=1)
TALLY_SUPERVISOR_BACKOFF_MAX_SECONDS = env_int("TALLY_SUPERVISOR_BACKOFF_MAX_SECONDS", 300, minimum=1)
TALLY_SUPERVISOR_MAX_ATTEMPTS = env_int("TALLY_SUPERVISOR_MAX_ATTEMPTS", 5, minimum=1)
TALLY_SUPERVISOR_STABLE_SECONDS = env_int("TALLY_SUPERVISOR_STABLE_SECONDS", 60, minimum=1)
TALLY_MAX_RUNS_PER_PIPELINE = env_int("TALLY_MAX_RUNS_PER_PIPELINE", 16, minimum=1)
# Engine host processes per Celery worker (consumers/engine/hosts.py): kafka-python runs are spread over them, so
# busy pipelines use every core. 0 runs them in the worker's own threads (one core for all).
TALLY_ENGINE_PROCESSES = env_int("TALLY_ENGINE_PROCESSES", os.cpu_count() or 1, minimum=0)
# PostgreSQL connections an engine process lends its runs (consumers/engine/db.py): a run borrows one per batch, so
# hundreds of runs in a host share these (plus one for the process's heartbeat, consumers/engine/beat.py).
TALLY_ENGINE_DB_CONNECTIONS = env_int("TALLY_ENGINE_DB_CONNECTIONS", 8, minimum=1)
# A run that found nothing to read for this long parks (consumers/engine/parking.py): it closes its Kafka consumer
# and one watcher per process wakes it when records arrive. 0 never parks (a run reads with its own consumer).
# The production worker sets it (docker-compose.yml): hundreds of idle runs then cost little CPU.
TALLY_PARK_IDLE_SECONDS = env_int("TALLY_PARK_IDLE_SECONDS", 0, minimum=0)
# The queue of pipeline run tasks. Production gives it workers of its own (docker-compose.yml): a run holds a
# worker thread as long as it runs, so sharing threads with the periodic tasks would starve them.
TALLY_PIPELINE_QUEUE = env_str("TALLY_PIPELINE_QUEUE", "celery")
# A run task still in the queue after this long: the pipeline is "waiting for a worker" (page, alert).
TALLY_WORKER_WAIT_SECONDS = env_int("TALLY_WORKER_WAIT_SECONDS", 30, minimum=1)
# A run on the supervisor's own host whose process is gone is dead without waiting out its lease.
TALLY_SUPERVISOR_CHECK_LOCAL_PIDS = env_bool("TALLY_SUPERVISOR_CHECK_LOCAL_PIDS", True)
# How long a rewind waits for the paused pipeline's runs to end before it gives up (nothing moved).
TALLY_REWIND_STOP_TIMEOUT_SECONDS = env_int("TALLY_REWIND_STOP_TIMEOUT_SECONDS", 30, minimum=1)
CELERY_BEAT_SCHEDULE["pipelines-supervise"] = {
    "task": "consumers.supervise", "schedule": TALLY_SUPERVISOR_INTERVAL_SECONDS,
    "options": {"expires": TALLY_SUPERVISOR_INTERVAL_SECONDS}}
# An engine process frozen mid-COPY escapes the idle-transaction limit: this pass ends its session once the COPY is
# older than that limit (consumers/operations/frozen_copies.py).
CELERY_BEAT_SCHEDULE["engine-frozen-copies"] = {
    "task": "consumers.end_frozen_copies", "schedule": TALLY_SUPERVISOR_INTERVAL_SECONDS,
    "options": {"expires": TALLY_SUPERVISOR_INTERVAL_SECONDS}}

# --- Reconciliation (consumers/reconciliation/: reconcile.py, snapshots.py) ------------------------------
RECONCILE_INTERVAL_SECONDS = env_int("RECONCILE_INTERVAL_SECONDS", 30, minimum=1)
# The lag evaluation window (docs/reconciliation.md): 10 snapshots at one per minute, as Burrow's default.
RECONCILE_WINDOW_SECONDS = env_int("RECONCILE_WINDOW_SECONDS", 600, minimum=10)
# Pipelines a reconciliation pass checks side by side (threads, one database connection each).
TALLY_RECONCILE_THREADS = env_int("TALLY_RECONCILE_THREADS", 4, minimum=1)
CELERY_BEAT_SCHEDULE["reconcile-all"] = {"task": "consumers.reconcile_all", "schedule": RECONCILE_INTERVAL_SECONDS,
                                         "options": {"expires": RECONCILE_INTERVAL_SECONDS}}
# Watches (consumers/reconciliation/watch_audit.py): each check audits what was committed and settled since the
# last one, so a finding shows within a watch's settle time plus this interval.
# A watch check whose settled ranges hold at least this many records matches them on Spark executors
# (consumers/reconciliation/watch_spark.py) instead of inside PostgreSQL; 0: never on Spark.
WATCH_SPARK_THRESHOLD = env_int("TALLY_WATCH_SPARK_THRESHOLD", 5_000_000, minimum=0)
WATCH_CHECK_INTERVAL_SECONDS = env_int("WATCH_CHECK_INTERVAL_SECONDS", 30, minimum=1)
CELERY_BEAT_SCHEDULE["watches-check"] = {"task": "consumers.check_watches", "schedule": WATCH_CHECK_INTERVAL_SECONDS,
                                         "options": {"expires": WATCH_CHECK_INTERVAL_SECONDS}}
CELERY_BEAT_SCHEDULE["lag-snapshots"] = {"task": "consumers.take_lag_snapshots", "schedule": 60,
                                         "options": {"expires": 60}}
CELERY_BEAT_SCHEDULE["lag-snapshots-downsample"] = {"task": "consumers.downsample_lag_snapshots",
                                                    "schedule": 300, "options": {"expires": 300}}

# --- History: ledger compaction and retention of Tally's own tables (consumers/reconciliation/compaction.py,
# consumers/operations/retention.py, alerts/retention.py) ------------------------------------------------------
# Ledger rows of the recent past stay one row per batch (trace and the timeline show each batch there).
TALLY_LEDGER_KEEP_DAYS = env_int("TALLY_LEDGER_KEEP_DAYS", 7, minimum=0)
TALLY_COMPACTION_INTERVAL_SECONDS = env_int("TALLY_COMPACTION_INTERVAL_SECONDS", 300, minimum=10)
# Days each kind of history is kept. The action log is the audit trail: kept longest (checked below).
TALLY_RETAIN_RUNS_DAYS = env_int("TALLY_RETAIN_RUNS_DAYS", 30, minimum=1)
TALLY_RETAIN_ALERTS_DAYS = env_int("TALLY_RETAIN_ALERTS_DAYS", 180, minimum=1)
TALLY_RETAIN_DEAD_LETTERS_DAYS = env_int("TALLY_RETAIN_DEAD_LETTERS_DAYS", 90, minimum=1)
TALLY_RETAIN_TOPIC_CHECKS_DAYS = env_int("TALLY_RETAIN_TOPIC_CHECKS_DAYS", 90, minimum=1)
# A watch's ranges and findings (consumers/reconciliation/watch_history.py): older ones fold into one range.
TALLY_RETAIN_WATCH_HISTORY_DAYS = env_int("TALLY_RETAIN_WATCH_HISTORY_DAYS", 90, minimum=1)
TALLY_RETAIN_ACTION_LOG_DAYS = env_int("TALLY_RETAIN_ACTION_LOG_DAYS", 730, minimum=1)
if TALLY_RETAIN_ACTION_LOG_DAYS < max(TALLY_RETAIN_RUNS_DAYS, TALLY_RETAIN_ALERTS_DAYS, TALLY_RETAIN_DEAD_LETTERS_DAYS,
                                      TALLY_RETAIN_TOPIC_CHECKS_DAYS, TALLY_RETAIN_WATCH_HISTORY_DAYS):
    raise ImproperlyConfigured("TALLY_RETAIN_ACTION_LOG_DAYS must be at least every other TALLY_RETAIN_*_DAYS: "
                               "the action log is the audit trail of what the others record.")
CELERY_BEAT_SCHEDULE["ledger-compaction"] = {"task": "consumers.compact_ledger",
                                             "schedule": TALLY_COMPACTION_INTERVAL_SECONDS,
                                             "options": {"expires": TALLY_COMPACTION_INTERVAL_SECONDS}}
CELERY_BEAT_SCHEDULE["retention"] = {"task": "consumers.apply_retention", "schedule": 3600,
                                     "options": {"expires": 3600}}
CELERY_BEAT_SCHEDULE["alert-retention"] = {"task": "tally.alerts.apply_retention", "schedule": 3600,
                                           "options": {"expires": 3600}}

# --- Spark -------------------------------------------------------------------------------------------
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "1g")
SPARK_JDBC_JAR = env_str("SPARK_JDBC_JAR", "/usr/share/java/postgresql.jar")
# A Celery worker starts its Spark driver (JVM, session, Python workers) when it starts, in the background,
# so the first Spark run it gets -- the demo's -- does not wait tens of seconds for a JVM. `make run` sets it.
SPARK_WARM_ON_WORKER_START = env_bool("SPARK_WARM_ON_WORKER_START", False)
# A running topic check writes a heartbeat about every fifth of this; one silent for longer lost its worker (killed,
# a lost machine) and is ended as failed by the periodic pass below. Long: a JVM's start or a full GC may be slow.
TALLY_TOPIC_CHECK_LEASE_SECONDS = env_int("TALLY_TOPIC_CHECK_LEASE_SECONDS", 120, minimum=10)
CELERY_BEAT_SCHEDULE["topic-checks-fail-stale"] = {"task": "consumers.fail_stale_topic_checks", "schedule": 30,
                                                   "options": {"expires": 30}}

# --- Email and alerts --------------------------------------------------------------------------------
EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "tally@localhost")
# Email is configured when EMAIL_URL or EMAIL_HOST is given: only then is password reset offered.
EMAIL_CONFIGURED = "EMAIL_URL" in os.environ or "EMAIL_HOST" in os.environ
if (DEBUG or TALLY_DEVELOPMENT) and not EMAIL_CONFIGURED:
    # Local development without an SMTP server: print emails instead of failing to send them.
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
globals().update(env_email("EMAIL_URL"))
ALERT_RECIPIENTS = env_list("ALERT_RECIPIENTS", [])
TALLY_BASE_URL = env_web_url("TALLY_BASE_URL", "http://127.0.0.1:8000")
# Alerts (alerts/): evaluated by beat right after reconciliation; emails go through an outbox.
ALERT_EVALUATE_SECONDS = env_int("ALERT_EVALUATE_SECONDS", 30, minimum=5)
ALERT_REWIND_GRACE_SECONDS = env_int("ALERT_REWIND_GRACE_SECONDS", 600, minimum=0)
ALERT_SEND_MAX_ATTEMPTS = env_int("ALERT_SEND_MAX_ATTEMPTS", 10, minimum=1)
# Alert channels (webhook, Slack, PagerDuty; docs/alerts.md): HTTP timeout, how long a message is retried,
# and after how many failed attempts in a row a channel shows as failing (and the admins are told once).
ALERT_CHANNEL_TIMEOUT_SECONDS = env_int("ALERT_CHANNEL_TIMEOUT_SECONDS", 10, minimum=1)
ALERT_CHANNEL_GIVE_UP_HOURS = env_int("ALERT_CHANNEL_GIVE_UP_HOURS", 72, minimum=1)
ALERT_CHANNEL_FAILING_AFTER = env_int("ALERT_CHANNEL_FAILING_AFTER", 5, minimum=1)
CELERY_BEAT_SCHEDULE["alerts-evaluate"] = {"task": "tally.alerts.evaluate", "schedule": ALERT_EVALUATE_SECONDS,
                                           "options": {"expires": ALERT_EVALUATE_SECONDS}}

# Checked here: logging would refuse a bad level only at django.setup(), in a traceback that names no variable.
TALLY_LOG_LEVEL = env_choice("TALLY_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"kafka_close": {"()": "tally.log_filters.DropCancelledMetadataRefresh"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "tally": {"handlers": ["console"], "level": TALLY_LOG_LEVEL},
        "kafka": {"handlers": ["console"], "level": "WARNING"},
        "kafka.cluster": {"filters": ["kafka_close"]},   # a clean close is not an error (tally/log_filters.py)
    },
}
