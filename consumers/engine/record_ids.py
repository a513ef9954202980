"""What in a Kafka record names its row in a team's table: a watch's record-id SPEC and its ignore specs.

    value        the record value as text (UTF-8)
    key          the record key as text
    json:PATH    a field of the JSON value, PATH dotted (`order.id`); a string as it is, a number or a
                 boolean as JSON writes it (`42`, `true`)
    offset       the record's partition and offset (the table holds both: --row-id PART_COL,OFFSET_COL)

An ignore spec is SPEC=VALUE (`json:type=heartbeat`, `key=ping`): records whose SPEC gives VALUE are
skipped by the consumer on purpose, so no row is expected for them.

A record whose id cannot be derived (no value, not UTF-8, not JSON, no such field, a JSON object or list
at PATH) gives None: no row can name it, so it is counted as unreadable, never as lost.
"""
import json
from dataclasses import dataclass

OFFSET = "offset"
KINDS = ("value", "key", "json", OFFSET)


class SpecError(ValueError):
    pass


@dataclass(frozen=True)
class RecordIdSpec:
    kind: str                      # value | key | json | offset
    path: tuple[str, ...] = ()     # for json

    @property
    def columns(self) -> int:
        """How many row-id columns the table needs for this spec."""
        return 2 if self.kind == OFFSET else 1

    def __str__(self):
        return f"json:{'.'.join(self.path)}" if self.kind == "json" else self.kind

    def extract(self, key: bytes | None, value: bytes | None) -> str | None:
        """The record's id as text (None: it has none). Not for `offset`, whose id is the position."""
        if self.kind == "value":
            return _text(value)
        if self.kind == "key":
            return _text(key)
        if self.kind == "json":
            return json_field(value, self.path)
        raise SpecError("an offset id is the record's position, not a field")


def parse_spec(text: str) -> RecordIdSpec:
    if not isinstance(text, str) or not text:
        raise SpecError("a record id is one of value, key, json:PATH or offset")
    if text in ("value", "key", OFFSET):
        return RecordIdSpec(text)
    if text.startswith("json:"):
        path = tuple(text[5:].split("."))
        if not all(path):
            raise SpecError(f"{text!r}: json:PATH needs a dotted path of field names, e.g. json:order.id")
        return RecordIdSpec("json", path)
    raise SpecError(f"unknown record id {text!r}: use value, key, json:PATH or offset")


@dataclass(frozen=True)
class IgnoreSpec:
    spec: RecordIdSpec
    value: str

    def __str__(self):
        return f"{self.spec}={self.value}"

    def matches(self, key: bytes | None, value: bytes | None) -> bool:
        return self.spec.extract(key, value) == self.value


def parse_ignore(text: str) -> IgnoreSpec:
    if not isinstance(text, str) or "=" not in text:
        raise SpecError(f"{text!r}: an ignore spec is SPEC=VALUE, e.g. json:type=heartbeat")
    spec_text, _, expected = text.partition("=")
    spec = parse_spec(spec_text)
    if spec.kind == OFFSET:
        raise SpecError(f"{text!r}: ignore by value, key or json:PATH, not by offset")
    return IgnoreSpec(spec, expected)


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def json_field(value: bytes | None, path: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    try:
        found = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    for name in path:
        if not isinstance(found, dict) or name not in found:
            return None
        found = found[name]
    if found is None or isinstance(found, dict | list):
        return None
    return found if isinstance(found, str) else json.dumps(found)
