"""Watches declared in a TOML file (`manage.py watch apply watches.toml`), applied idempotently.

    [watches.orders-service]
    group = "orders-service"
    topic = "orders"
    sink_table = "orders"            # optional: the audit (with record_id and row_id)
    record_id = "json:order.id"      # value, key, json:PATH or offset
    row_id = "id"                    # PART_COL,OFFSET_COL for offset
    start_from = "earliest"          # or latest, or an ISO date and time
    settle_seconds = 30
    ignore = ["json:type=heartbeat"]
    keyed = false

Every watch of the file is validated (consumers/operations/watch_setup.py, as the command, the form and the
API) before anything changes; then all creations commit in one transaction. Applying the same file twice
changes nothing. A watch whose settings differ from the file is refused: its settled ranges belong to its
settings, so change one by deleting it and applying again. Watches not in the file are left alone.
"""
import tomllib
from dataclasses import dataclass, field

from django.db import transaction

from consumers.models import Watch
from consumers.operations import watch_setup
from consumers.operations.watch_setup import Invalid, WatchSpec


class FileRefused(ValueError):
    pass


@dataclass
class Plan:
    create: list[WatchSpec] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    not_in_file: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"create {s.name}: group {s.group} on {s.topic}"
               + (f", auditing {s.sink_table} by {s.record_id}" if s.sink_table else "") for s in self.create]
        out += [f"unchanged {name}" for name in self.unchanged]
        out += [f"not in file, left alone: {name}" for name in self.not_in_file]
        return out

    def summary(self) -> str:
        return f"{len(self.create)} to create, {len(self.unchanged)} unchanged."


def load(path: str) -> list[WatchSpec]:
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise FileRefused(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileRefused(f"{path} is not valid TOML: {exc}") from None
    watches = document.get("watches")
    if set(document) - {"watches"} or not isinstance(watches, dict) or not watches:
        raise FileRefused(f"{path}: declare each watch as a [watches.NAME] table (found top-level keys: "
                          f"{', '.join(sorted(document)) or 'none'})")
    specs = []
    for name, values in watches.items():
        if not isinstance(values, dict):
            raise FileRefused(f"{path}: watches.{name} must be a table of settings")
        specs.append(WatchSpec.from_mapping(name, values))
    return specs


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
            problems += [f"  {spec.name}.{f}: {m}" for f, m in exc.problems.items()]
    result.not_in_file = sorted(set(existing) - {s.name for s in specs})
    if problems:
        raise FileRefused("nothing was changed; fix these first:\n" + "\n".join(problems))
    return result


def apply(path: str, *, actor: str = "cli", dry_run: bool = False) -> Plan:
    specs = load(path)
    if dry_run:
        return plan(specs)
    with transaction.atomic():
        result = plan(specs)
        try:
            for spec in result.create:
                watch_setup.create(spec, actor)
        except Invalid as exc:
            raise FileRefused(f"nothing was changed: {exc}") from None
    return result
