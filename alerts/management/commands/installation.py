"""`installation show [--json]`: this installation's key, which PagerDuty dedup_keys and webhook ids name.
`installation new-key [--disable-channels]`: a key of its own for a copied database (staging, a test restore),
so its alerts never fold into or resolve the incidents of the installation it was copied from. Audited (actor
"cli"). Exit codes: 0 done, 2 usage error."""
from alerts import installation
from alerts.models import Channel, Installation
from consumers.management.cli import SubcommandsCommand, as_json

ACTOR = "cli"


class Command(SubcommandsCommand):
    help = ("Show this installation's key, or give a copied database a key of its own (new-key). "
            "Exit 0 done, 2 usage error.")
    exit_codes = "0 done, 2 usage error"

    def add_subcommands(self, commands):
        self.subcommand(commands, "show", "This installation's key and its enabled alert channels.", json=True)
        new = commands.add_parser("new-key", help="Replace the key: run it on a copy of another installation's "
                                                  "database before it evaluates alerts.")
        new.add_argument("--disable-channels", action="store_true",
                         help="Also disable every alert channel the copy holds (they are the original's receivers).")

    def do_show(self, json: bool, **options):
        shown = {"key": Installation.current().key.hex,
                 "enabled_channels": list(Channel.objects.filter(enabled=True).values_list("name", flat=True))}
        if json:
            self.stdout.write(as_json(shown))
            return
        self.stdout.write(f"Installation key: {shown['key']}")
        self.stdout.write(f"Enabled alert channels: {', '.join(shown['enabled_channels']) or 'none'}")

    def do_new_key(self, disable_channels: bool, **options):
        done = installation.new_key(ACTOR, disable_channels=disable_channels)
        self.stdout.write(f"Done: {installation.summary(done)}.")
