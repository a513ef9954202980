"""`groups list`, `groups describe G`, `groups reset G --topic T <mode> [--partition P ...] [--execute]`:
consumer groups that Tally does not run. Reset is a dry run unless --execute, and is refused while the
group has active members. Exit codes: 0 done, 1 refused (the reason on stderr), 2 usage error."""
import json

from django.core.management.base import CommandError

from consumers.kafka import clusters
from consumers.kafka.admin import KafkaAdminError
from consumers.kafka.errors import ClusterConfigError
from consumers.management.cli import SubcommandsCommand, refused
from consumers.management.commands.rewind import add_mode_arguments, chosen_mode, print_plan
from consumers.operations import groups
from consumers.operations.errors import Refused, Unavailable
from consumers.operations.group_reset import reset_group


class Command(SubcommandsCommand):
    help = "List, describe and reset consumer groups Tally does not run. Exit 0 done, 1 refused, 2 usage error."

    def add_subcommands(self, commands):
        listing = self.subcommand(commands, "list", "Group ids (not Tally's own pipelines' groups).", json=True)
        listing.add_argument("--all", action="store_true", help="Include Tally pipelines' groups.")
        describe = self.subcommand(commands, "describe", "State, members, committed offset, end offset, lag.",
                                   "group", json=True)
        reset = self.subcommand(commands, "reset", "Reset committed offsets (dry run unless --execute).", "group",
                                json=True)
        reset.add_argument("--topic", required=True)
        add_mode_arguments(reset)
        reset.add_argument("--execute", action="store_true", help="Apply the plan (default: dry run).")
        reset.add_argument("--actor", default="cli", help="Who asks (for the action log).")
        for sub in (listing, describe, reset):
            sub.add_argument("--cluster", default="default",
                             help="The Kafka cluster (default, or a name from the TALLY_KAFKA_CLUSTERS file).")

    def do_list(self, **options) -> None:
        _known_cluster(options["cluster"])
        try:
            names = groups.list_groups(include_pipelines=options["all"], cluster=options["cluster"])
        except KafkaAdminError as exc:
            raise CommandError(str(exc), returncode=1) from None
        self.stdout.write(json.dumps(names) if options["json"] else "\n".join(names))

    def do_describe(self, **options) -> None:
        group_id = options["group"]
        _known_cluster(options["cluster"])
        report = groups.describe(group_id, cluster=options["cluster"])
        if report.errors and not report.known:
            raise CommandError(f"Failed: Kafka: {'; '.join(report.errors)}", returncode=1)
        if report.unknown:
            raise refused(f"{groups.unknown_group_message(group_id, options['cluster'])} "
                          "(`groups list --all` shows the groups)")
        if options["json"]:
            self.stdout.write(json.dumps(report.as_json(), indent=2, default=str))
            return
        owner = f" (Tally pipeline {report.pipeline})" if report.pipeline else ""
        self.stdout.write(f"group {report.group_id} on cluster {report.cluster}{owner}: state {report.state}, "
                          f"{len(report.members)} member(s)")
        for member in report.members:
            self.stdout.write(f"  member {member.get('member_id')} {member.get('client_id')} {member.get('host')}")
        self.stdout.write(f"{'topic':>20} {'partition':>9} {'committed':>10} {'end':>10} {'lag':>8}")
        for p in report.partitions:
            self.stdout.write(f"{p.topic:>20} {p.partition:>9} {str(p.committed):>10} {str(p.high_watermark):>10} "
                              f"{str(p.lag_records):>8}")
        for error in report.errors:
            self.stderr.write(f"warning: {error}")

    def do_reset(self, **options) -> None:
        mode, value = chosen_mode(options)
        try:
            result = reset_group(options["group"], options["topic"], mode, value, partitions=options["partitions"],
                                 execute=options["execute"], actor=options["actor"], cluster=options["cluster"])
        except Unavailable as exc:  # recorded in the action log by the operation
            raise CommandError(f"Failed: {exc}", returncode=1) from None
        except Refused as exc:
            raise refused(str(exc)) from None
        data = result.as_dict()
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            print_plan(self.stdout, data)


def _known_cluster(name: str) -> None:
    """An unknown cluster is the operator's mistake, refused as `groups reset` refuses it, before Kafka is asked."""
    try:
        clusters.get(name)
    except ClusterConfigError as exc:
        raise refused(str(exc)) from None
