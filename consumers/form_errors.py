"""How a Django form shows an operation's Invalid: each problem beside the field it names (or above the form
when the form has no such field). One helper for every form door (dashboard, alerts, admin), so the rule's
message is the operation's and the form only places it."""
from consumers.operations.errors import Invalid


def add_problems(form, exc: Invalid, renamed: dict[str, str] | None = None) -> None:
    """`renamed` maps a spec's field to the form's name for it, where they differ."""
    for field, message in exc.problems.items():
        field = (renamed or {}).get(field, field)
        form.add_error(field if field in form.fields else None, message)
