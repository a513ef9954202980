"""Pipelines declared in a TOML file (`manage.py pipeline apply pipelines.toml`), applied idempotently.

    [pipelines.orders]
    topic = "orders"
    sink_table = "orders_sink"
    mode = "exactly-once"                  # or at-least-once, at-most-once
    transform = "myapp.transforms.orders"  # a registered name or a dotted path
    group = "orders"                       # optional, defaults to the name
    engine = "python"                      # or spark
    isolation_level = "read_committed"     # the default; or read_uncommitted (python engine only)
    on_log_truncated = "stop"              # the default; or skip (records deleted before they were read)
    runs = 2                               # engine processes sharing the partitions (default 1; python engine)
    kafka_client = "librdkafka"            # or kafka-python; left out: the worker's TALLY_KAFKA_CLIENT
    create_table = true                    # create the sink table when it is missing
    cluster = "prod"                       # optional: a Kafka cluster from TALLY_KAFKA_CLUSTERS (default)
    # transform = "json": JSON fields onto the existing table's columns, by its types
    map = { order_id = "id", customer = "customer.name" }   # where a column does not take the field of its name
    # map = { ordered_at = "sent::seconds" }  # a number into a timestamp: epoch seconds, not milliseconds
    upsert_key = ["order_id"]              # one row per key, kept current (a unique constraint on it)
    delete_on_tombstone = true             # a null value deletes its key's row (the key from map = "@key")

Every pipeline of the file is validated (consumers/operations/pipeline_setup.py) before anything changes; then all
creations and changes commit in one transaction. Applying the same file twice changes nothing. A setting
left out takes its default, also for an existing pipeline: the file says the whole pipeline. Of an existing
pipeline only transform, map, engine, isolation_level, on_log_truncated, runs and kafka_client may change, while it
is stopped.
Pipelines that exist but are not in the file are listed and left alone: deleting is an explicit `pipeline delete`.
"""
from consumers.models import Pipeline
from consumers.operations import declared_file, pipeline_setup
from consumers.operations.declared_file import FileRefused  # noqa: F401 - what apply() raises, named beside it
from consumers.operations.pipeline_setup import Invalid, PipelineSpec


class Plan(declared_file.FilePlan):
    def create_line(self, spec: PipelineSpec) -> str:
        return f"create {spec.name}: {spec.topic} -> {spec.sink_table} ({_settings(spec)})"


def _settings(spec: PipelineSpec) -> str:
    """Mode and transform, and the reading settings that are not the defaults."""
    defaults = PipelineSpec(name="", topic="", sink_table="")
    extra = [f"{name} {getattr(spec, name)}" for name in ("isolation_level", "on_log_truncated", "runs",
                                                                  "kafka_client")
             if getattr(spec, name) != getattr(defaults, name)]
    return ", ".join([spec.mode, f"transform {spec.transform}", *extra])


def load(path: str) -> list[PipelineSpec]:
    return [PipelineSpec.from_mapping(name, values)
            for name, values in declared_file.tables(path, "pipelines", "pipeline").items()]


def plan(specs: list[PipelineSpec]) -> Plan:
    """What applying the specs would do; FileRefused listing every problem of every pipeline."""
    result, problems = Plan(), []
    existing = {p.name: p for p in Pipeline.objects.all()}
    for spec in specs:
        try:
            pipeline = existing.get(spec.name)
            if pipeline is None:
                pipeline_setup.validate(spec)
                result.create.append(spec)
            elif diff := pipeline_setup.check_update(spec, pipeline):
                result.update.append((spec, pipeline, diff))
            else:
                result.unchanged.append(spec.name)
        except Invalid as exc:
            problems += declared_file.problem_lines(spec.name, exc)
    groups = [s.group_id for s in specs]
    for group in {g for g in groups if groups.count(g) > 1}:
        problems.append(f"  group {group!r} is used by several pipelines of the file: give each its own group")
    return declared_file.finish(result, specs, existing, problems)


def apply(path: str, *, actor: str = "cli", dry_run: bool = False) -> Plan:
    return declared_file.apply(load(path), plan, create=pipeline_setup.create, update=pipeline_setup.update,
                               actor=actor, dry_run=dry_run)
