"""Text as PostgreSQL stores it. A `text` or `varchar` value cannot hold NUL, and UTF-8 cannot encode a
lone surrogate (JSON's "\\ud800" decodes to one), so the driver raises on either: a 500 at the door, or a batch
rolled back for good. Inputs are refused with these checks before anything is written; what is written anyway
(the action log's record of a refused request, a transform's error that quotes its record) is made storable
here, escaped rather than dropped, so that it still shows what was tried.

Django-free: the commit protocol imports it on Spark's executors too (consumers/models/text.py adds the
rules that read the models)."""
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
    """An error as a row keeps it (a run's end reason, a pipeline's last error, an action's message, a dead
    letter's reason): storable and cut to ERROR_TEXT_MAX."""
    return storable(text)[:ERROR_TEXT_MAX]


def exception_text(exc: BaseException) -> str:
    """"Type: message" of a failure in code that is not ours (a transform), as a row keeps it; one whose own
    str() fails is named by its type."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not fail the batch it is recorded in
        message = "(its message could not be read)"
    return error_text(f"{type(exc).__name__}: {message}")
