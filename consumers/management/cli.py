"""What Tally's management commands share: subcommands dispatched to `do_NAME` methods, and one way to say
no. Exit codes everywhere: 0 done, 1 refused (the reason on stderr, after "Refused: "), 2 usage error."""
import argparse
import json
from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError

from consumers.access import record_refusal
from consumers.models import ActionLog
from consumers.operations.declared_file import FileRefused
from consumers.operations.errors import DeleteRefused
from consumers.pg_text import unstorable


def refused(message: str) -> CommandError:
    return CommandError(f"Refused: {message}", returncode=1)


def not_valid(noun: str, problems: dict[str, str]) -> CommandError:
    """A spec's problems, one line a field, as every door shows them."""
    lines = "\n".join(f"  {field}: {message}" for field, message in problems.items())
    return refused(f"the {noun} is not valid:\n{lines}")


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high`; anything else is a usage error (exit 2), like a
    missing option, not a refusal."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"a whole number from {low} to {high}, got {text!r}")
        return value
    return parse


def as_json(data) -> str:
    return json.dumps(data, indent=2)


def argument_problem(options: dict) -> str | None:
    """Why the command's text arguments cannot be taken, or None: one PostgreSQL cannot store (bytes that are not
    UTF-8 reach Python as lone surrogates), or an --actor longer than the action log's column."""
    for key, value in options.items():
        for text in value if isinstance(value, list | tuple) else [value]:
            problem = unstorable(text) if isinstance(text, str) else None
            if problem:
                return f"the argument {key!r} {problem}"
    actor = options.get("actor")
    limit = ActionLog._meta.get_field("actor").max_length
    if isinstance(actor, str) and len(actor) > limit:
        return f"the argument 'actor' takes at most {limit} characters (the action log's column), got {len(actor)}"
    return None


class TallyCommand(BaseCommand):
    """A Tally command: its help ends with its exit codes. Arguments no command could store are refused (and
    audited) before any command runs."""

    exit_codes = "0 done, 1 refused (the reason is printed), 2 usage error"

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.epilog = f"Exit codes: {self.exit_codes}."
        return parser

    def execute(self, *args, **options):
        problem = argument_problem(options) or next(filter(None, (argument_problem({"positional": a}) for a in args)),
                                                    None)
        if problem:
            name = self.__module__.rsplit(".", 1)[-1]
            command = options.get("command")
            record_refusal(options.get("actor") or "cli", f"{name} {command}" if command else name,
                           f"bad input: {problem}", params={"via": "cli"})
            raise refused(problem)
        return super().execute(*args, **options)


class SubcommandsCommand(TallyCommand):
    """`manage.py NAME SUBCOMMAND ...`: `add_subcommands` declares them, and each runs as `do_SUBCOMMAND(**options)`
    (a hyphen in its name an underscore)."""

    # Subcommands whose refusals (exit 1) this door writes to the action log, and under which action: those
    # whose operation logs only what it did (create, delete, apply). Others log their own refusals, and an
    # exit 1 already in the log (a failed channel test) is raised with `logged = True`.
    audited_refusals: dict[str, str] = {}
    # The options a refusal's entry names (never one that may hold a secret).
    refusal_params: tuple[str, ...] = ("name", "file")

    def add_arguments(self, parser):
        self.add_subcommands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))

    def add_subcommands(self, commands) -> None:
        raise NotImplementedError

    @staticmethod
    def subcommand(commands, name: str, help: str, *positionals: str, json: bool = False) -> argparse.ArgumentParser:
        """A subcommand taking `positionals` (a name, a file) and, with `json`, --json: its answer as JSON."""
        parser = commands.add_parser(name, help=help)
        for positional in positionals:
            parser.add_argument(positional)
        if json:
            parser.add_argument("--json", action="store_true", help="The answer as JSON.")
        return parser

    def handle(self, *args, command, **options):
        try:
            getattr(self, f"do_{command.replace('-', '_')}")(**options)
        except CommandError as error:
            if error.returncode == 1 and command in self.audited_refusals and not getattr(error, "logged", False):
                asked = {key: options[key] for key in self.refusal_params if options.get(key)}
                record_refusal(options.get("actor") or "cli", self.audited_refusals[command],
                               str(error).removeprefix("Refused: "), params={"via": "cli", **asked})
            raise

    def write_list(self, rows: list[dict], *, json: bool, columns: list[tuple[str, str, Callable[[dict], str]]]):
        """A `list` subcommand's answer: the rows as JSON, or a table of `columns` (heading, format spec such as
        "<24", and the cell's text from a row)."""
        if json:
            self.stdout.write(as_json(rows))
            return
        self.stdout.write(" ".join(f"{heading:{spec}}" for heading, spec, _ in columns).rstrip())
        for row in rows:
            self.stdout.write(" ".join(f"{cell(row):{spec}}" for _, spec, cell in columns).rstrip())

    def delete_named(self, delete, *, name: str, actor: str, done: str) -> None:
        """`delete NAME` (a pipeline, a watch): `done` once deleted, or exit 1 saying why it was refused."""
        try:
            delete(name, actor)
        except DeleteRefused as exc:
            raise refused(str(exc)) from None
        self.stdout.write(done)

    def apply_file(self, apply, *, file: str, actor: str, dry_run: bool) -> None:
        """`apply FILE` (pipelines.toml, watches.toml): what it did, or with --dry-run would do, a line an entry,
        then the counts."""
        try:
            plan = apply(file, actor=actor, dry_run=dry_run)
        except FileRefused as exc:
            raise refused(str(exc)) from None
        for line in plan.lines():
            self.stdout.write(line)
        self.stdout.write(("Dry run: nothing changed. " if dry_run else "") + plan.summary(applied=not dry_run))
