"""What a declaration file (pipelines.toml, watches.toml) does the same whatever it declares: it is read as
one TOML document of [SECTION.NAME] tables, every problem of every entry is listed before anything changes,
and then everything it asks for is applied in one transaction, or nothing is."""
import tomllib
from collections.abc import Callable

from django.db import transaction

from consumers.operations.errors import Invalid


class FileRefused(ValueError):
    pass


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
    declared = document.get(section)
    if set(document) - {section} or not isinstance(declared, dict) or not declared:
        raise FileRefused(f"{path}: declare each {noun} as a [{section}.NAME] table (found top-level keys: "
                          f"{', '.join(sorted(document)) or 'none'})")
    for name, values in declared.items():
        if not isinstance(values, dict):
            raise FileRefused(f"{path}: {section}.{name} must be a table of settings")
    return declared


def refuse_problems(problems: list[str]) -> None:
    if problems:
        raise FileRefused("nothing was changed; fix these first:\n" + "\n".join(problems))


def apply(specs: list, plan: Callable, carry_out: Callable, *, dry_run: bool):
    """The plan of `specs`; unless a dry run, carried out in the transaction that planned it (a concurrent
    change of the same name then fails the whole file)."""
    if dry_run:
        return plan(specs)
    with transaction.atomic():
        result = plan(specs)
        try:
            carry_out(result)
        except Invalid as exc:
            raise FileRefused(f"nothing was changed: {exc}") from None
    return result
