"""`alert_channel add NAME --kind email|webhook|slack|pagerduty [--url U] [--to A] [--routing-key K]
[--secret S] [--rule NAME ...]`, `alert_channel list [--json]`, `alert_channel test NAME`,
`alert_channel delete NAME`: a thin shell over alerts.channel_actions. Secrets are never printed.
Exit codes: 0 done, 1 refused or the test was not answered with 2xx (the reason on stderr), 2 usage error.
Every refusal is in the action log (actor "cli"), with the channel's name and kind only: never a setting."""
import json

from alerts import channel_actions
from alerts.channel_actions import ChannelInvalid
from alerts.channels import KINDS
from alerts.models import Channel
from consumers.management.cli import SubcommandsCommand, not_valid, refused

ACTOR = "cli"


class Command(SubcommandsCommand):
    help = ("Add, list, test and delete alert channels (email, webhook, Slack, PagerDuty). "
            "Exit 0 done, 1 refused or test failed, 2 usage error.")
    exit_codes = "0 done, 1 refused or the test was not answered with 2xx (the reason is printed), 2 usage error"
    audited_refusals = {"add": "alert_channel_add", "test": "alert_channel_test", "delete": "alert_channel_delete"}
    refusal_params = ("name", "kind")

    def add_subcommands(self, commands):
        add = commands.add_parser("add", help="Add a channel. Validated before anything is written.")
        add.add_argument("name", help="Letters, digits, '-' and '_'.")
        add.add_argument("--kind", required=True, choices=list(KINDS))
        add.add_argument("--url", default="", help="Webhook or Slack incoming-webhook URL; PagerDuty events URL "
                                                   "(default: PagerDuty's). Never shown again.")
        add.add_argument("--to", default="", help="Email: comma-separated addresses.")
        add.add_argument("--routing-key", default="",
                         help="PagerDuty: the integration's routing key. Never shown again.")
        add.add_argument("--secret", default="", help="Webhook: HMAC-SHA256 signing secret. Never shown again.")
        add.add_argument("--rule", action="append", default=[], metavar="RULE",
                         help="Route only this alert rule here (repeat for more); none: every rule.")
        listing = commands.add_parser("list", help="Every channel, masked, with its routing and state.")
        listing.add_argument("--json", action="store_true")
        test = commands.add_parser("test", help="Send a test notification and print the receiver's answer.")
        test.add_argument("name")
        delete = commands.add_parser("delete", help="Delete a channel and its outbox.")
        delete.add_argument("name")

    def _channel(self, name: str) -> Channel:
        channel = Channel.objects.filter(name=name).first()
        if channel is None:
            raise refused(f"no alert channel named {name!r}.")
        return channel

    def do_add(self, **options):
        name, kind = options["name"], options["kind"]
        if Channel.objects.filter(name=name).exists():
            raise refused(f"an alert channel named {name!r} exists already.")
        channel = Channel(name=name, kind=kind, url=options["url"], recipients=options["to"],
                          routing_key=options["routing_key"], secret=options["secret"])
        try:
            rules = channel_actions.rules_named(options["rule"]) if options["rule"] else []
            channel_actions.save(channel, ACTOR, rules)
        except ChannelInvalid as exc:
            raise not_valid("channel", exc.problems) from None
        self.stdout.write(f"Added alert channel {self._line(channel)}")

    def do_list(self, **options):
        channels = list(Channel.objects.prefetch_related("rules"))
        if options["json"]:
            self.stdout.write(json.dumps([c.as_json() for c in channels], indent=2))
            return
        for channel in channels:
            self.stdout.write(self._line(channel))
        if not channels:
            self.stdout.write("No alert channels: alerts go to the rules' email recipients only.")

    def do_test(self, **options):
        channel = self._channel(options["name"])
        ok, answer = channel_actions.test(channel, ACTOR)
        if not ok:
            failed = refused(f"the test of {channel.name} failed: {answer}")
            failed.logged = True   # channel_actions.test logged it, as failed
            raise failed
        self.stdout.write(f"{channel.name}: {answer}")

    def do_delete(self, **options):
        channel = self._channel(options["name"])
        closed = channel_actions.delete(channel, ACTOR)
        self.stdout.write(f"Deleted alert channel {channel.name}." + (f" Before that: {closed}." if closed else ""))

    @staticmethod
    def _line(channel: Channel) -> str:
        shown = channel.as_json()
        where = shown.get("url") or ", ".join(shown.get("to") or [])
        extra = [f"routing key {shown['routing_key']}" if shown.get("routing_key") else "",
                 "signed" if shown.get("signed") else "", "" if channel.enabled else "disabled",
                 "FAILING" if channel.is_failing else ""]
        rules = shown["rules"] if shown["rules"] == "all" else ", ".join(shown["rules"])
        return (f"{channel.name}  {channel.kind}  {where}  rules: {rules}"
                + "".join(f"  {e}" for e in extra if e))
