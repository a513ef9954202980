"""What a declaration file (pipelines.toml, watches.toml) does the same whatever it declares: it is read as
one TOML document of [SECTION.NAME] tables, every problem of every entry is listed before anything changes,
and then everything it asks for is applied in one transaction, or nothing is."""
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import transaction

from consumers.operations.errors import Invalid
from consumers.pg_text import unstorable


class FileRefused(ValueError):
    pass


@dataclass
class FilePlan:
    """What applying a file does or would do, by name. A kind whose entries may change in place (pipelines)
    fills `update` with (spec, current, {setting: (current, in the file)}); one whose may not (watches) leaves
    it empty and sets `changes_in_place` to False, so that its summary does not speak of changes."""
    create: list = field(default_factory=list)
    update: list[tuple] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    not_in_file: list[str] = field(default_factory=list)
    changes_in_place = True

    def create_line(self, spec) -> str:
        raise NotImplementedError

    def lines(self) -> list[str]:
        out = [self.create_line(spec) for spec in self.create]
        out += [f"update {spec.name}: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in diff.items())
                for spec, _, diff in self.update]
        out += [f"unchanged {name}" for name in self.unchanged]
        out += [f"not in file, left alone: {name}" for name in self.not_in_file]
        return out

    def summary(self, *, applied: bool) -> str:
        """The counts: what was done once applied, or what a dry run would do."""
        updated = ([f"updated {len(self.update)}" if applied else f"{len(self.update)} to change"]
                   if self.changes_in_place else [])
        created = f"created {len(self.create)}" if applied else f"{len(self.create)} to create"
        return ", ".join([created, *updated, f"{len(self.unchanged)} unchanged."])


def tables(path: str, section: str, noun: str) -> dict[str, dict]:
    """{NAME: settings} of the file's [SECTION.NAME] tables; FileRefused if it holds anything else."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise FileRefused(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileRefused(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise FileRefused(f"{path} is not valid TOML: it is not UTF-8 text") from None
    except RecursionError:   # tomllib's parser recurses per nested array or inline table
        raise FileRefused(f"{path} is not valid TOML: it nests too deeply") from None
    where = _unstorable_text(document)
    if where:
        raise FileRefused(f"{path}: {where}")
    declared = document.get(section)
    if set(document) - {section} or not isinstance(declared, dict) or not declared:
        raise FileRefused(f"{path}: declare each {noun} as a [{section}.NAME] table (found top-level keys: "
                          f"{', '.join(sorted(document)) or 'none'})")
    for name, values in declared.items():
        if not isinstance(values, dict):
            raise FileRefused(f"{path}: {section}.{name} must be a table of settings")
    return declared


def _unstorable_text(value, at: str = "") -> str:
    """Where the document holds a key or text PostgreSQL cannot store (TOML's "\u0000", say), and why; "" when
    nowhere. Checked once for the whole file: every name and setting reaches a query or a column."""
    if isinstance(value, str):
        why = unstorable(value)
        return f"{at or 'a value'} {why}" if why else ""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        place = f"{at}.{key}" if at else str(key)
        why = unstorable(key) if isinstance(key, str) else None
        found = f"the name {place!r} {why}" if why else _unstorable_text(item, place)
        if found:
            return found
    return ""


def problem_lines(name: str, exc: Invalid) -> list[str]:
    """An entry's problems as the refusal lists them, a line each."""
    return [f"  {name}.{field}: {message}" for field, message in exc.problems.items()]


def finish(result: FilePlan, specs: list, existing: dict, problems: list[str]) -> FilePlan:
    """The plan once every entry was looked at: FileRefused listing every problem, if any; else the plan, with
    the names that exist but are not in the file (left alone: deleting is an explicit command)."""
    if problems:
        raise FileRefused("nothing was changed; fix these first:\n" + "\n".join(problems))
    result.not_in_file = sorted(set(existing) - {spec.name for spec in specs})
    return result


def apply(specs: list, plan: Callable, *, create: Callable, update: Callable | None = None, actor: str,
          dry_run: bool):
    """The plan of `specs`; unless a dry run, carried out (`create(spec, actor)` each new entry,
    `update(spec, current, actor)` each changed one) in the transaction that planned it: a concurrent change
    of the same name then fails the whole file."""
    if dry_run:
        return plan(specs)
    with transaction.atomic():
        result = plan(specs)
        try:
            for spec in result.create:
                create(spec, actor)
            for spec, current, _ in result.update:
                update(spec, current, actor)
        except Invalid as exc:
            raise FileRefused(f"nothing was changed: {exc}") from None
    return result
