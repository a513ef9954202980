"""Transforms for dead-letter replay tests: the "fixed" versions of int_value and csv_ints, which accept
the records the originals rejected (digits with junk around them). No tests here."""
import re

from consumers.engine.transforms import BadRecord, Transform


def _digits(text: bytes) -> int:
    digits = re.sub(rb"[^0-9]", b"", text or b"")
    if not digits:
        raise BadRecord(f"no digits in {text[:80]!r}")
    return int(digits)


lenient_int = Transform("lenient_int", (("id", "bigint"),), lambda r: ((_digits(r.value),),))
lenient_csv = Transform("lenient_csv", (("id", "bigint"),),
                        lambda r: tuple((_digits(part),) for part in (r.value or b"").split(b",")), multi_row=True)
lenient_event = Transform("lenient_event", (("id", "bigint"), ("kind", "text")),
                          lambda r: ((_digits(r.value), "replayed"),))


def _quoting(record):
    """Like many users' transforms: the error quotes the record's own text, which may hold NUL or a lone surrogate."""
    text = (record.value or b"").decode("utf-8", "surrogatepass")
    if not text.isdigit():
        raise BadRecord(f"not a number: {text}")
    return ((int(text),),)


class UnreadableError(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def _unreadable(record):
    if record.value == b"boom":
        raise UnreadableError()
    return ((int(record.value),),)


quoting_int = Transform("quoting_int", (("id", "bigint"),), _quoting)
unreadable_error_int = Transform("unreadable_error_int", (("id", "bigint"),), _unreadable)
