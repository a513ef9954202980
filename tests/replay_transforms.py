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
