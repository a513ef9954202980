"""Text as PostgreSQL stores it. A `text` or `varchar` value cannot hold NUL, and UTF-8 cannot encode a
lone surrogate (JSON's "\\ud800" decodes to one), so the driver raises on either: a 500 at the door.
Inputs are refused with these checks before anything is written; what is written anyway (the action
log's record of a refused request) is made storable here, escaped rather than dropped, so that it still
shows what was tried."""
import re

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def unstorable(text: str) -> str | None:
    """Why PostgreSQL cannot store `text`, or None."""
    if "\x00" in text:
        return "holds a NUL character, which cannot be stored"
    if _LONE_SURROGATE.search(text):
        return "holds a lone surrogate (not valid Unicode), which cannot be stored"
    return None


def storable(value) -> str:
    """`value` as text PostgreSQL can store: NUL and lone surrogates escaped (\\x00, \\ud800)."""
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\x00", "\\x00")
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


ERROR_TEXT_MAX = 2000  # characters of an error kept on a row: the cause and its context, never a whole dump


def error_text(text) -> str:
    """An error as a row keeps it (a run's end reason, a pipeline's last error, an action's message): storable
    and cut to ERROR_TEXT_MAX."""
    return storable(text)[:ERROR_TEXT_MAX]


def fit(model, field: str, value) -> str:
    """`value` made storable and cut to the `max_length` of `model.field` (unlimited for a TextField)."""
    text = storable(value)
    limit = model._meta.get_field(field).max_length
    return text[:limit] if limit else text


def storable_json(value, *, max_chars: int):
    """A JSON value whose every string (keys included) is storable and at most `max_chars` long."""
    if isinstance(value, dict):
        return {storable(k)[:max_chars]: storable_json(v, max_chars=max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v, max_chars=max_chars) for v in value]
    if isinstance(value, str):
        return storable(value)[:max_chars]
    if value is None or isinstance(value, bool | int | float):
        return value
    return storable(value)[:max_chars]
