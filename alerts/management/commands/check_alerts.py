"""`check_alerts [--json] [--no-send]`: evaluate every alert rule once, then deliver whatever is due in every
outbox (the rules' emails and the channels'), for cron and tests."""
import json

from alerts.evaluate import evaluate_all
from alerts.outbox import deliver_due
from consumers.management.cli import TallyCommand


class Command(TallyCommand):
    help = ("Evaluate alert rules once, then deliver due notifications (emails and channels, retrying failed ones "
            "whose time has come).")
    exit_codes = "0 done, 2 usage error"

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="Print the evaluation report as JSON.")
        parser.add_argument("--no-send", action="store_true", help="Only evaluate; leave notifications in the outbox.")

    def handle(self, *args, **options):
        report = evaluate_all().as_json()
        report["emails"] = None if options["no_send"] else deliver_due()
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
            return
        for alert in report["firing"]:
            subject = f"watch {alert['pipeline']}" if alert["kind"] == "watch" else alert["pipeline"]
            self.stdout.write(f"FIRING  {subject}: {alert['summary']} [{alert['state']}]")
        for label in report["resolved"]:
            self.stdout.write(f"RESOLVED {label}")
        for error in report["errors"]:
            self.stderr.write(f"ERROR {error}")
        emails = report["emails"]
        watches = f"{report['watches']} watch{'' if report['watches'] == 1 else 'es'}"
        self.stdout.write(f"{report['pipelines']} pipelines, {watches}, {report['checks']} checks, "
                          f"{len(report['firing'])} firing"
                          + (f"; messages sent {emails['sent']}, failed {emails['failed']}" if emails else ""))
