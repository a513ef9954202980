"""Times for `--transform json` (consumers/engine/json_map.py): ISO-8601 text and epoch numbers into timestamptz,
timestamp and date columns, as PostgreSQL would read them.

A number counts epoch milliseconds unless the mapping's source names its unit (`ts::seconds`, `split_unit`):
the converter is built for one unit when the plan compiles, so no record pays for the choice. Naming a unit says
the field is an epoch number, so then digits written as text ("1764288000", as many producers write numbers) are
read as that number too; without one, such text stays refused, as before units could be named.
"""
import math
import re
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIME_TYPES = ("timestamptz", "timestamp", "date")
UNIT_MARK = "::"
MILLISECONDS = "milliseconds"  # the unit of a number without one, as before units could be named
# Each unit as a power of ten of a microsecond (PostgreSQL's resolution).
EPOCH_UNITS = {"seconds": 6, MILLISECONDS: 3, "microseconds": 0, "nanoseconds": -3}
# Beyond any timestamp PostgreSQL holds in any unit (294276 AD is ~9.3e18 microseconds): refused before int() makes
# a huge integer of a number such as 1e300.
_EPOCH_DIGITS = 22   # an epoch number of 10**22 or more is out of range in any unit

# The ISO-8601 text PostgreSQL reads as Python does: passed on as it is once Python has validated it.
PLAIN_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
                             r"(?:Z|[+-][0-9]{2}:[0-9]{2})")
# An epoch number written as text, as JSON would write it without an exponent: read only under a named unit.
EPOCH_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
# A fraction of a second finer than a microsecond ("10:30:00.1234567Z", as .NET writes it).
_FINE_FRACTION = re.compile(r"\.([0-9]{7,})")


class Millis(int):
    """A record timestamp (epoch milliseconds): a timestamptz takes it as an instant, a bigint as its number."""


def split_unit(source: str) -> tuple[str, str | None]:
    """(the source without its unit, the unit or None): `ts::seconds` -> ("ts", "seconds"). ValueError for a
    unit that is not one."""
    path, mark, unit = source.rpartition(UNIT_MARK)
    if not mark:
        return source, None
    if unit not in EPOCH_UNITS:
        raise ValueError(f"unknown unit {unit!r}: a number's epoch unit is "
                         + ", ".join(f"::{name}" for name in EPOCH_UNITS) + f" (e.g. {path or 'ts'}::seconds)")
    return path, unit


def instant(value, unit: str | None = None) -> datetime:
    """ISO-8601 text or an epoch number in `unit` -> an aware datetime (text without an offset is UTC). `unit` None
    is the default, milliseconds, for a number only; a named unit also reads its number written as text."""
    if type(value) is str:
        if unit is not None and EPOCH_TEXT.fullmatch(value):
            return _epoch(Decimal(value), unit)
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(_not_a_time(value, unit, "timestamp")) from None
        fine = _FINE_FRACTION.search(value)
        if fine is not None:  # Python cuts it to the microsecond; PostgreSQL rounds it (half to even), as here
            moment = moment.replace(microsecond=0) + timedelta(microseconds=round(Decimal("0." + fine.group(1))
                                                                                  * 1_000_000))
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    if unit is not None and unit != MILLISECONDS:
        return _epoch(value, unit)
    if type(value) is Decimal and value.is_finite() and value and value.adjusted() >= _EPOCH_DIGITS:
        # Before int() (1e10000000 would take it an hour) and abs() (which overflows the context)
        raise ValueError("epoch milliseconds out of range")
    if type(value) is int or type(value) is Millis or (type(value) is float and value.is_integer()) or \
            (type(value) is Decimal and value.is_finite() and value == value.to_integral_value()):
        try:
            return EPOCH + timedelta(milliseconds=int(value))
        except OverflowError:
            raise ValueError("epoch milliseconds out of range") from None
    raise ValueError("not an ISO-8601 timestamp or epoch milliseconds")


def _not_a_time(text: str, unit: str | None, what: str) -> str:
    """Why text is no time: under a named unit, nor its epoch number; without one, digits get the unit to name."""
    if unit is not None:
        return f"not an ISO-8601 {what}, nor epoch {unit} written as digits"
    if EPOCH_TEXT.fullmatch(text.strip()):  # "1714559400000": an epoch number written as text
        return (f"not an ISO-8601 {what}; epoch {MILLISECONDS} written as text are read only when the source "
                f"names its unit (SOURCE::{MILLISECONDS}, ::seconds, ...)")
    return f"not an ISO-8601 {what}"


def _epoch(value, unit: str) -> datetime:
    """A number of epoch `unit`s: whole, except seconds, which may carry a fraction (time.time()); what is finer
    than a microsecond is rounded half to even, as PostgreSQL rounds it."""
    kind = type(value)
    if kind is int:
        number = Decimal(value)
    elif kind is float and math.isfinite(value):
        number = Decimal(repr(value))  # the number as written (1714559400.123456), not the float's binary digits
    elif kind is Decimal and value.is_finite():
        number = value
    else:
        raise ValueError(f"not an ISO-8601 timestamp or epoch {unit}")
    if number and number.adjusted() >= _EPOCH_DIGITS:   # first: to_integral_value() of 1e10000000 overflows
        raise ValueError(f"epoch {unit} out of range")
    if unit != "seconds" and number != number.to_integral_value():
        raise ValueError(f"not a whole number of epoch {unit}")
    micros = number.scaleb(EPOCH_UNITS[unit]).to_integral_value(rounding=ROUND_HALF_EVEN)
    try:
        return EPOCH + timedelta(microseconds=int(micros))
    except OverflowError:
        raise ValueError(f"epoch {unit} out of range") from None


def valid_timestamp(text: str) -> bool:
    """Plain ISO-8601 text (PLAIN_TIMESTAMP) names a real date and time: no 2024-02-30."""
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def timestamptz(column, unit: str | None = None):
    def convert(value):
        if type(value) is str and PLAIN_TIMESTAMP.fullmatch(value):
            if not valid_timestamp(value):
                raise ValueError("not an ISO-8601 timestamp")
            return value
        return instant(value, unit).isoformat()
    return convert


def timestamp(column, unit: str | None = None):
    # Without a time zone: the instant's UTC wall clock.
    return lambda value: instant(value, unit).astimezone(UTC).replace(tzinfo=None).isoformat()


def date_of(column, unit: str | None = None):
    def convert(value):
        if type(value) is str and not (unit is not None and EPOCH_TEXT.fullmatch(value)):
            # The date as written, as PostgreSQL reads the text: an offset does not move it to another day.
            try:
                return (date.fromisoformat(value) if len(value) == 10 else datetime.fromisoformat(value).date()
                        ).isoformat()
            except ValueError:
                raise ValueError(_not_a_time(value, unit, "date")) from None
        return instant(value, unit).astimezone(UTC).date().isoformat()
    return convert
