"""`pipeline create|list|show|delete|apply|start|stop|pause|resume|restart` — a thin shell over
consumers.operations.pipeline_setup (adding, changing, deleting) and consumers.operations.actions (running).
Exit codes: 0 done, 1 refused or failed (the reason on stderr: e.g. no run enqueued, the task broker down), 2 usage
error."""
import json
from operator import itemgetter

from django.core.management.base import CommandError

from consumers.engine import json_map
from consumers.management.cli import SubcommandsCommand, as_json, not_valid, refused
from consumers.models import ActionResult, Pipeline
from consumers.operations import actions, pipeline_file, pipeline_setup
from consumers.operations.pipeline_setup import DELIVERY_MODES, Invalid, PipelineSpec


class Command(SubcommandsCommand):
    help = ("Add, list, show, delete, apply (from pipelines.toml) and run pipelines (audited). "
            "Exit 0 done, 1 refused or failed, 2 usage error.")
    audited_refusals = {"create": "create", "delete": "delete", "apply": "apply_pipelines"}

    def add_subcommands(self, commands):
        create = commands.add_parser("create", help="Add a pipeline (stopped). Validated before anything is written.")
        create.add_argument("name", help="Lower-case letters, digits, '-' and '_'.")
        create.add_argument("--topic", required=True, help="The Kafka topic to consume (must exist).")
        create.add_argument("--sink-table", required=True,
                            help="The PostgreSQL table to write (must exist with the transform's columns and "
                                 "provenance, unless --create-table).")
        create.add_argument("--mode", choices=list(DELIVERY_MODES), default="exactly-once")
        create.add_argument("--transform", default="int_value",
                            help="json (JSON fields onto the table's own columns, by their types), a registered "
                                 "transform (int_value, json_event, csv_ints) or a dotted path to your own "
                                 "consumers.engine.transforms.Transform, e.g. myapp.transforms.orders.")
        create.add_argument("--map", action="append", default=[], metavar="COLUMN=SOURCE",
                            help="--transform json: where COLUMN comes from instead of the top-level field of its "
                                 "name: a dotted path (customer.name, items.0.sku), @key, @key.PATH, @timestamp, "
                                 "@partition, @offset or @header:NAME; SOURCE::seconds (::milliseconds, the "
                                 "default, ::microseconds, ::nanoseconds): the epoch unit of a number into a "
                                 "timestamp or date column. Repeatable.")
        create.add_argument("--upsert-key", default="", metavar="COLUMN[,COLUMN]",
                            help="Keep one row per key, inserted or updated in place (the table needs a unique "
                                 "constraint on these columns).")
        create.add_argument("--delete-on-tombstone", action="store_true",
                            help="With --upsert-key: a record with a null value deletes its key's row.")
        create.add_argument("--group", default="", help="Kafka consumer group id (default: the name).")
        create.add_argument("--engine", choices=["python", "spark"], default="python")
        # No argparse choices: a wrong value is refused by pipeline_setup, with the file's and the form's message.
        create.add_argument("--isolation-level", default="read_committed", metavar="read_committed|read_uncommitted",
                            help="read_committed (default): records of aborted transactions never reach the sink.")
        create.add_argument("--on-log-truncated", default="stop", metavar="stop|skip",
                            help="When the log start passed the stored position (retention, a recreated topic): "
                                 "stop (default) with the reason, or skip the lost records (noted in the ledger, "
                                 "alerted).")
        create.add_argument("--runs", type=int, default=1, metavar="N",
                            help="Run the pipeline in N engine processes at once, which split its partitions and "
                                 "are supervised as one (python engine; default 1).")
        create.add_argument("--kafka-client", default="", metavar="kafka-python|librdkafka",
                            help="The python engine's Kafka client: kafka-python, or librdkafka (the extra "
                                 "tally[rdkafka]: decodes outside the GIL). Default: the worker's TALLY_KAFKA_CLIENT.")
        create.add_argument("--create-table", action="store_true", help="Create the sink table if it is missing.")
        create.add_argument("--cluster", default="default",
                            help="The Kafka cluster of the topic: default (KAFKA_* settings) or a name from the "
                                 "TALLY_KAFKA_CLUSTERS file.")
        create.add_argument("--json", action="store_true", help="Print the pipeline as JSON.")

        self.subcommand(commands, "list", "Every pipeline with its topic, sink, mode and state.", json=True)
        self.subcommand(commands, "show", "One pipeline's settings and positions.", "name", json=True)
        self.subcommand(commands, "delete", "Delete a stopped pipeline (the action log and the sink table are kept).",
                        "name")
        apply = commands.add_parser("apply", help="Create or change pipelines from a TOML file; idempotent.")
        apply.add_argument("file", help="A pipelines.toml: one [pipelines.NAME] table per pipeline.")
        apply.add_argument("--dry-run", action="store_true", help="Print what would change; change nothing.")
        for action in actions.ACTIONS:
            run = self.subcommand(commands, action, f"{action.capitalize()} a pipeline (audited).", "name")
            if actions.TRANSITIONS[action].enqueue_run:   # stop and pause start no run: --runs is a usage error
                run.add_argument("--runs", type=int, default=None,
                                 help="How many runs share the partitions from now on (default: the pipeline's "
                                      "--runs, which this changes).")
        for sub in commands.choices.values():
            sub.add_argument("--actor", default="cli", help="Who asks (for the action log).")

    def handle(self, *args, command, **options):
        if command not in actions.ACTIONS:
            return super().handle(*args, command=command, **options)
        try:
            entry = actions.perform(command, options["name"], options["actor"], runs=options.get("runs"))
        except actions.ActionRefused as exc:
            raise refused(str(exc)) from None
        if entry.result == ActionResult.FAILED:   # e.g. no run enqueued (the task broker down): not done
            raise CommandError(f"{options['name']}: {entry.message}", returncode=1)
        self.stdout.write(f"{options['name']}: {entry.message}")

    def do_create(self, *, actor, name, topic, sink_table, mode, transform, group, engine, isolation_level,
                  on_log_truncated, create_table, cluster, runs, map, upsert_key, delete_on_tombstone, kafka_client,
                  **options):
        try:
            mapping = json_map.parse_map_options(map)
        except ValueError as exc:
            raise CommandError(str(exc), returncode=2) from None
        spec = PipelineSpec(name=name, topic=topic, sink_table=sink_table, mode=mode, transform=transform,
                            group=group, engine=engine, isolation_level=isolation_level,
                            on_log_truncated=on_log_truncated, runs=runs, create_table=create_table, cluster=cluster,
                            map=mapping, upsert_key=upsert_key, delete_on_tombstone=delete_on_tombstone,
                            kafka_client=kafka_client)
        try:
            pipeline = pipeline_setup.create(spec, actor)
        except Invalid as exc:
            raise not_valid("pipeline", exc.problems) from None
        if options["json"]:
            self.stdout.write(json.dumps(as_dict(pipeline)))
        else:
            self.stdout.write(f"Created pipeline {name} ({mode}, {topic} -> {sink_table}, group {pipeline.group_id}, "
                              f"stopped). Start it with: manage.py pipeline start {name}")

    def do_list(self, *, json: bool, **options):
        self.write_list([as_dict(p) for p in Pipeline.objects.order_by("name")], json=json, columns=[
            ("NAME", "<28", itemgetter("name")), ("STATE", "<8", itemgetter("desired_state")),
            ("MODE", "<14", itemgetter("mode")), ("ENGINE", "<7", itemgetter("engine")),
            ("TOPIC", "<28", itemgetter("topic")), ("SINK TABLE", "", itemgetter("sink_table"))])

    def do_show(self, *, name, json: bool, **options):
        pipeline = Pipeline.objects.filter(name=name).first()
        if pipeline is None:
            raise refused(f"No pipeline named {name!r}.")
        data = as_dict(pipeline)
        data["positions"] = actions.positions(pipeline)
        if json:
            self.stdout.write(as_json(data))
            return
        for key, value in data.items():
            self.stdout.write(f"{key + ':':<18} {value}")

    def do_delete(self, *, actor, name, **options):
        self.delete_named(pipeline_setup.delete, name=name, actor=actor,
                          done=f"Deleted pipeline {name}; its action log and sink table are kept.")

    def do_apply(self, *, actor, file, dry_run, **options):
        self.apply_file(pipeline_file.apply, file=file, actor=actor, dry_run=dry_run)


def as_dict(pipeline: Pipeline) -> dict:
    return {"name": pipeline.name, "topic": pipeline.topic, "sink_table": pipeline.sink_table,
            "mode": PipelineSpec.of(pipeline).mode, "transform": pipeline.transform, "group": pipeline.group_id,
            "engine": pipeline.engine, "isolation_level": pipeline.isolation_level,
            "on_log_truncated": pipeline.on_log_truncated, "runs": pipeline.parallel_runs,
            "map": pipeline.json_map, "upsert_key": pipeline.upsert_key,
            "delete_on_tombstone": pipeline.delete_on_tombstone, "kafka_client": pipeline.kafka_client,
            "desired_state": pipeline.desired_state, "epoch": pipeline.epoch, "cluster": pipeline.cluster}
