"""Run the embedded Kafka-compatible broker in the foreground on 127.0.0.1."""
import signal

from django.core.management.base import BaseCommand, CommandError

from consumers.kafka import broker


class Command(BaseCommand):
    help = "Run the embedded Kafka-compatible broker (Tansu, memory storage) in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=9092, help="TCP port on 127.0.0.1 (default 9092).")

    def handle(self, *args, port, **options):
        process = None
        stopping = False

        def stop(signum, frame):
            # Installed before the broker starts, so a signal at any moment stops it.
            nonlocal stopping
            stopping = True
            if process is not None:
                broker.stop_broker(process)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            process = broker.start_broker(port)
        except broker.BrokerError as exc:
            raise CommandError(str(exc)) from exc
        if stopping:
            broker.stop_broker(process)
            return
        self.stdout.write(f"Kafka-compatible broker listening on 127.0.0.1:{port} (memory storage). "
                          f"Ctrl-C to stop.")
        code = process.wait()
        if not stopping and code != 0:
            raise CommandError(f"The broker exited with code {code}.")
