"""Watches declared in a TOML file (`manage.py watch apply watches.toml`), applied idempotently.

    [watches.orders-service]
    group = "orders-service"
    topic = "orders"
    sink_table = "orders"            # optional: the audit (with record_id and row_id)
    record_id = "json:order.id"      # value, key, json:PATH or offset
    row_id = "id"                    # PART_COL,OFFSET_COL for offset
    start_from = "earliest"          # or latest, or an ISO date and time (a TOML datetime too)
    settle_seconds = 30
    ignore = ["json:type=heartbeat"]
    keyed = false

Every watch of the file is validated (consumers/operations/watch_setup.py, as the command, the form and the
API) before anything changes; then all creations commit in one transaction. Applying the same file twice
changes nothing. A watch whose settings differ from the file is refused: its settled ranges belong to its
settings, so change one by deleting it and applying again. Watches not in the file are left alone.
"""
from consumers.models import Watch
from consumers.operations import declared_file, watch_setup
from consumers.operations.declared_file import FileRefused  # noqa: F401 - what apply() raises, named beside it
from consumers.operations.watch_setup import Invalid, WatchSpec


class Plan(declared_file.FilePlan):
    changes_in_place = False  # a watch's settled ranges belong to its settings: changed by delete and apply

    def create_line(self, spec: WatchSpec) -> str:
        return (f"create {spec.name}: group {spec.group} on {spec.topic}"
                + (f", auditing {spec.sink_table} by {spec.record_id}" if spec.sink_table else ""))


def load(path: str) -> list[WatchSpec]:
    return [WatchSpec.from_mapping(name, values)
            for name, values in declared_file.tables(path, "watches", "watch").items()]


def _same(spec: WatchSpec, watch: Watch) -> dict:
    """{setting: (current, in the file)} where they differ."""
    defaults = WatchSpec(name="", group="", topic="")
    current = watch_setup.describe(watch)
    wanted = {name: getattr(spec, name) for name in WatchSpec.FIELDS}
    wanted["row_id"] = ",".join(spec.columns)
    wanted["start_from"] = spec.start_from or defaults.start_from
    return {k: (current[k], v) for k, v in wanted.items() if current[k] != v}


def plan(specs: list[WatchSpec]) -> Plan:
    result, problems = Plan(), []
    existing = {w.name: w for w in Watch.objects.all()}
    for spec in specs:
        watch = existing.get(spec.name)
        try:
            if watch is None:
                watch_setup.validate(spec)
                result.create.append(spec)
            elif diff := _same(spec, watch):
                problems.append(f"  {spec.name}: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
                                + f": a watch's ranges belong to its settings; `watch delete {spec.name}` first")
            else:
                result.unchanged.append(spec.name)
        except Invalid as exc:
            problems += declared_file.problem_lines(spec.name, exc)
    return declared_file.finish(result, specs, existing, problems)


def apply(path: str, *, actor: str = "cli", dry_run: bool = False) -> Plan:
    return declared_file.apply(load(path), plan, create=watch_setup.create, actor=actor, dry_run=dry_run)
