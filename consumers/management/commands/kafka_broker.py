"""Run the embedded Kafka-compatible broker in the foreground on 127.0.0.1."""
import signal
import threading

from django.core.management.base import BaseCommand, CommandError

from consumers.kafka import broker

# How often the main thread looks at the broker and at the stop flag: a signal is acted on within this.
WATCH_INTERVAL_S = 0.2


class Command(BaseCommand):
    help = "Run the embedded Kafka-compatible broker (Tansu, memory storage) in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=9092, help="TCP port on 127.0.0.1 (default 9092).")

    def handle(self, *args, port, **options):
        # The handlers only set a flag: stopping the broker from a handler waited on the Popen the main thread
        # was already waiting on, and a SIGTERM to the whole process group (which may kill the broker first)
        # then hung the command for good. The main thread watches both the flag and the broker instead.
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
        signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
        try:
            process = broker.start_broker(port)
        except broker.BrokerError as exc:
            raise CommandError(str(exc)) from exc
        try:
            if not stopping.is_set():
                self.stdout.write(f"Kafka-compatible broker listening on 127.0.0.1:{port} (memory storage). "
                                  f"Ctrl-C to stop.")
            while process.poll() is None and not stopping.wait(WATCH_INTERVAL_S):
                pass
        finally:
            broker.stop_broker(process)  # returns at once when the broker is gone already
        if not stopping.is_set() and process.returncode != 0:
            raise CommandError(f"The broker exited with code {process.returncode}.")
