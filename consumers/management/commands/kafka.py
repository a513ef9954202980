"""`kafka check [CLUSTER] [--json]`: can Tally use this Kafka cluster? `kafka clusters [--json]`: which are
configured (no secret, only where each secret is read from).

`check` walks the steps (settings, resolve, connect, tls, authenticate, metadata; consumers/kafka/check.py),
prints each, then the brokers, the number of topics and the mechanism. Without CLUSTER it checks every
configured cluster. Exit codes: 0 every cluster checked is usable, 1 one is not (which step failed and why
on stderr), 2 usage error."""
import json

from django.core.management.base import CommandError
from django.db import DatabaseError

from consumers.kafka import clusters
from consumers.kafka.check import check_cluster
from consumers.kafka.errors import ClusterConfigError
from consumers.management.cli import SubcommandsCommand, refused
from consumers.models import ClusterStatus

STEPS = ("settings", "resolve", "connect", "tls", "authenticate", "metadata")


class Command(SubcommandsCommand):
    help = "Check a Kafka cluster's connection step by step (kafka check [CLUSTER]); list clusters (kafka clusters)."
    exit_codes = "0 every cluster checked is usable, 1 one is not (the failed step and why are printed), 2 usage error"

    def add_subcommands(self, commands):
        check = self.subcommand(commands, "check", "Resolve, connect, TLS, authenticate, read metadata.", json=True)
        check.add_argument("cluster", nargs="?", help="A cluster name (default: every configured cluster).")
        self.subcommand(commands, "clusters", "The configured clusters (secrets never shown).", json=True)

    def do_clusters(self, **options) -> None:
        self.list_clusters(options["json"])

    def do_check(self, **options) -> None:
        if options["cluster"]:
            _refuse_unknown(options["cluster"])
        try:
            names = [options["cluster"]] if options["cluster"] else clusters.names()
        except ClusterConfigError as exc:
            raise CommandError(str(exc), returncode=1) from None
        results = [self.check_and_record(name) for name in names]
        if options["json"]:
            self.stdout.write(json.dumps([r.as_dict() for r in results] if not options["cluster"]
                                         else results[0].as_dict()))
        else:
            for result in results:
                self.print_result(result)
        failed = [r for r in results if not r.ok]
        if failed:
            raise CommandError("\n".join(r.error for r in failed), returncode=1)

    def check_and_record(self, name: str):
        """The check, remembered for the Clusters page when the database is there (a check of Kafka must
        work without it)."""
        result = check_cluster(name)
        try:
            ClusterStatus.objects.record(result.cluster, reachable=result.ok, error=result.error,
                                         brokers=result.brokers, topics=result.topics)
        except DatabaseError as exc:
            self.stderr.write(f"warning: the result was not recorded: {type(exc).__name__}")
        return result

    def print_result(self, result) -> None:
        self.stdout.write(f"Cluster {result.cluster}: {result.bootstrap_servers or '?'} "
                          f"({result.protocol or '?'}, authentication: {result.mechanism or '?'})")
        if result.warning:
            self.stdout.write(f"  {'warning':<13}{result.warning}")
        for step in STEPS:
            if step in result.passed:
                self.stdout.write(f"  {step:<13}ok")
            elif step == result.step:
                self.stdout.write(f"  {step:<13}FAILED: {result.cause}: {result.detail}")
                break
        if result.ok:
            self.stdout.write(f"  brokers      {', '.join(result.brokers)}")
            self.stdout.write(f"  topics       {result.topics}")
            self.stdout.write(f"  mechanism    {result.mechanism}")
            self.stdout.write(f"  checked in   {result.seconds:.2f} s")

    def list_clusters(self, as_json: bool) -> None:
        try:
            found = clusters.all_clusters()
        except ClusterConfigError as exc:
            raise CommandError(str(exc), returncode=1) from None
        rows = [clusters.describe(c) for c in found]
        if as_json:
            self.stdout.write(json.dumps(rows))
            return
        for row in rows:
            self.stdout.write(f"{row['name']:<20} {row['bootstrap_servers']:<40} {row['security_protocol']:<15} "
                              f"{row['mechanism']}  ({row['source']})")
            if row["warning"]:
                self.stdout.write(f"  warning: {row['warning']}")


def _refuse_unknown(name: str) -> None:
    """A name that is not configured has no steps to walk: say only that (its header was all "?"), and record no
    status for a cluster that does not exist."""
    try:
        if name in clusters.names():
            return
        clusters.get(name)
    except ClusterConfigError as exc:
        if exc.cluster == name:
            raise refused(str(exc)) from None
        # Else the clusters file itself is wrong: the check's settings step says where.
