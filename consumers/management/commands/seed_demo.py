"""Seed the classic example: topic `nums` with "1".."N" and one demo pipeline per delivery mode."""
from django.core.management.base import BaseCommand, CommandError

from consumers.demo.classic import DemoError, seed_demo


class Command(BaseCommand):
    help = "Create topic nums (values 1..N as text) and the demo pipelines. Safe to re-run."

    def add_arguments(self, parser):
        parser.add_argument("--records", type=int, default=100, help="How many values (default 100).")
        parser.add_argument("--partitions", type=int, default=1, help="Partitions of topic nums (default 1).")
        parser.add_argument("--reset", action="store_true",
                            help="Start over: recreate the topic, drop the sinks, clear the pipelines' offsets and "
                                 "ledger (action log and alerts stay; a running one is stopped, audited).")

    def handle(self, *args, records, partitions, reset, **options):
        try:
            summary = seed_demo(records=records, partitions=partitions, reset=reset)
        except DemoError as exc:
            raise CommandError(str(exc)) from exc
        produced = (f"produced {summary['produced']} records" if summary["produced"]
                    else "the topic already held them")
        self.stdout.write(f"Topic {summary['topic']}: values 1..{records} over {partitions} partition(s), "
                          f"{produced}. Pipelines: {', '.join(summary['pipelines'])}.")
        for note in summary["notes"]:
            self.stdout.write(note)
