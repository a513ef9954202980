"""`make run`: the whole local stack in one foreground process.

Starts the embedded broker (when KAFKA_BOOTSTRAP_SERVERS is not reachable), a Celery worker, Celery beat
and the web server; seeds the demo; prints the URL and the login. Ctrl-C (or SIGTERM, or SIGHUP when its
terminal closes) stops every process it started — each child runs in its own session so that its whole process
group can be signalled. A devstack killed outright (SIGKILL) takes its children with it: each is started with
PR_SET_PDEATHSIG (SIGTERM), from the main thread (broker.die_with_parent).
"""
import os
import secrets
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError

from consumers.kafka import broker, clusters

PYTHON = sys.executable
PIPELINE_QUEUE = os.environ.get("TALLY_PIPELINE_QUEUE", "pipelines")


def stack_commands(host: str, port: int) -> dict[str, list[str]]:
    """The long-running processes of the stack, by name (also documented in the README)."""
    celery = [PYTHON, "-m", "celery", "-A", "tally"]
    return {
        # The threads pool: each pipeline is a long-lived task, and Spark must never be started in a
        # prefork child (docs/spark.md); threads let one worker host many pipelines. Pipeline runs have a queue
        # of their own (PIPELINE_QUEUE), as in docker-compose.yml: each holds a thread while it runs, and 16 of
        # them would leave the supervisor, reconciliation and alerts no thread in a shared worker.
        "worker": celery + ["worker", "-Q", PIPELINE_QUEUE, "-n", "pipelines@%h", "--pool", "threads",
                            "--concurrency", "16", "--loglevel", "INFO"],
        "tasks": celery + ["worker", "-Q", "celery", "-n", "tasks@%h", "--pool", "threads", "--concurrency", "4",
                           "--loglevel", "INFO"],
        "beat": celery + ["beat", "--loglevel", "INFO", "--schedule", os.path.join("var", "celerybeat-schedule")],
        "web": [PYTHON, "manage.py", "runserver", f"{host}:{port}", "--noreload"],
    }


def developer_environment() -> dict[str, str]:
    """The developer stack is where DEBUG is on (unless DEBUG is set): nowhere else defaults to it. The worker
    that runs the demo starts the Spark driver at once (CHILD_ENVIRONMENT), so the first demo run does not wait
    for a JVM."""
    return {**os.environ, "TALLY_DEVELOPMENT": "1", "DEBUG": os.environ.get("DEBUG", "true"),
            "SPARK_WARM_ON_WORKER_START": os.environ.get("SPARK_WARM_ON_WORKER_START", "true"),
            "TALLY_PIPELINE_QUEUE": PIPELINE_QUEUE}


# What one process of the stack is told besides. The demo task (consumers.demo.runs.RUN_DEMO_TASK) goes to the default
# "celery" queue, which the "tasks" worker takes, and it runs the demo's Spark pipeline on that worker's own driver:
# "tasks" warms Spark (developer_environment). The pipelines worker warms none: it starts a driver only for a Spark
# pipeline run, which the stack does not start (tests/test_devstack.py checks the route against the -Q lists).
CHILD_ENVIRONMENT = {"worker": {"SPARK_WARM_ON_WORKER_START": "false"}}


PASSWORD_FILE = os.path.join("var", "admin-password")
# Each stops the stack cleanly: Ctrl-C, `kill`, and the terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CHILDREN_GRACE_S = 8  # then SIGKILL: the stack as a whole stops within 10 s of a signal
BROKER_GRACE_S = 2  # of those, kept for the broker, which stops after its clients


def _stop(processes, deadline: float) -> None:
    """SIGTERM each process's group, wait until the deadline, then SIGKILL what is left."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


class Command(BaseCommand):
    help = "Run the local stack (broker if needed, worker, beat, web) until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-demo", action="store_true", help="Do not seed the demo pipelines.")

    def handle(self, *args, host, port, no_demo, **options):
        os.makedirs("var", exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = False
        # Explicit handlers: a shell may start us with SIGINT ignored, and SIGTERM must clean up too; SIGHUP (the
        # terminal closed) too, or its default would end this process and leave the children running.
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.interrupt)
        try:
            self.start_broker_if_needed()
            login, password = self.ensure_operator_login()
            if not no_demo and "seed_demo" in get_commands():
                call_command("seed_demo")
            for name, command in stack_commands(host, port).items():
                log = open(os.path.join("var", f"{name}.log"), "ab")
                # From this (the main) thread: PR_SET_PDEATHSIG fires when the thread that started a child ends.
                self.children[name] = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=broker.parent_death_preexec(),
                    env=developer_environment() | CHILD_ENVIRONMENT.get(name, {}))
            self.stdout.write(self.style.SUCCESS(
                f"\nTally is starting at http://{host}:{port}/  login: {login}, {password}\n"
                f"Processes: {', '.join(f'{n} (pid {p.pid})' for n, p in self.children.items())}; "
                f"logs in var/*.log. Ctrl-C stops everything.\n"))
            self.watch()
        except KeyboardInterrupt:
            self.stdout.write("\nStopping…")
        finally:
            self.stop_all()
            # And until the exit: at shutdown Python puts the default handlers back, so a late signal would end the
            # stopped stack as killed. (signal.signal first runs a pending handler: interrupt() absorbs it.)
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)

    def interrupt(self, signum, frame):
        # Only the first signal interrupts. A second one (Ctrl-C twice, or a `kill` meeting a Ctrl-C) may already be
        # pending while the first is handled: raised then, it broke into the clean-up and ended in a traceback.
        # Keeping this handler (rather than SIG_IGN) absorbs it quietly, wherever it lands.
        if not self.stopping:
            self.stopping = True
            raise KeyboardInterrupt

    def start_broker_if_needed(self):
        servers = settings.KAFKA_BOOTSTRAP_SERVERS
        if broker.is_reachable(servers):
            self.stdout.write(f"Using the Kafka cluster at {servers}.")
            return
        first = servers.split(",")[0]
        host, _, port = first.rpartition(":")
        if host not in ("127.0.0.1", "localhost"):
            raise CommandError(f"KAFKA_BOOTSTRAP_SERVERS={servers} is not reachable.")
        log = open(os.path.join("var", "broker.log"), "ab")
        try:
            self.children["broker"] = broker.start_broker(int(port), log_file=log)
        except broker.BrokerError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Started the embedded Kafka-compatible broker on 127.0.0.1:{port}.")

    def ensure_operator_login(self) -> tuple[str, str]:
        """The admin login, created only when missing: an existing user's password is never reset (unless
        DJANGO_SUPERUSER_PASSWORD asks for one). Returns (username, where the password is)."""
        username = os.environ.get("DJANGO_SUPERUSER_USERNAME", "admin")
        chosen = os.environ.get("DJANGO_SUPERUSER_PASSWORD")
        user, created = get_user_model().objects.get_or_create(username=username)
        if created or chosen:
            password = chosen or secrets.token_urlsafe(9)
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
            if chosen:
                where = "password from DJANGO_SUPERUSER_PASSWORD"
            else:
                # Kept beside the logs (var/ is not in git), readable by this user only.
                descriptor = os.open(PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(descriptor, "w") as handle:
                    handle.write(password + "\n")
                where = f"password in {PASSWORD_FILE} (new user)"
        else:
            where = (f"password unchanged (in {PASSWORD_FILE} since the user was created; "
                     f"`python manage.py changepassword {username}` sets a new one)")
        if "setup_roles" in get_commands():
            call_command("setup_roles", verbosity=0)
        return username, where

    def watch(self):
        while True:
            for name, process in self.children.items():
                if process.poll() is not None:
                    raise CommandError(f"{name} exited with code {process.returncode}; see var/{name}.log")
            time.sleep(0.5)

    def stop_all(self):
        # A second Ctrl-C, or the SIGTERM of a `kill -- -PGID` arriving after a child died, must not interrupt
        # the clean-up and leave children running: from here on, interrupt() absorbs every signal.
        self.stopping = True
        # The broker goes last: its clients (worker, beat, web) would log connection errors while they stop.
        # Children get most of the 10 s a stack has to stop in (docs: every long-running command), then SIGKILL.
        deadline = time.monotonic() + CHILDREN_GRACE_S
        clusters.close_shared_admins()   # this process's own client (the demo's seeding made it) is one of them
        clients = [process for name, process in self.children.items() if name != "broker"]
        _stop(clients, deadline - BROKER_GRACE_S)
        if "broker" in self.children:
            _stop([self.children["broker"]], deadline)
        self.stdout.write("All processes stopped.")
