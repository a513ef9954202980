"""A reconciliation finding: a range of offsets of one kind and how many records it counts.

Reconciliation builds and passes Findings; they become dicts only where they are stored (PartitionHealth.findings)
or served (the CLI's and the API's JSON), through `as_json`, and stored ones come back through `from_json`.
The kinds and what each means: docs/reconciliation.md.
"""
from dataclasses import dataclass

# Set only on some findings, and then in the JSON in this order, after kind, start, end and count.
_OPTIONAL = ("offsets", "reason", "folded", "scope", "planned")


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str                            # lost, duplicated, dead_letter, hole, gap, overlap, phantom, ...
    start: int
    end: int                             # exclusive
    count: int                           # records (positions for gap and overlap)
    offsets: tuple[int, ...] | None = None   # duplicated: the first offsets with extra copies, a sample
    reason: str | None = None            # unrecoverable and ahead: why (a ledger note, "position ahead ...")
    folded: int | None = None            # a covering finding: how many findings it folded
    scope: str | None = None             # verified (kept until its range is verified again) or current
    planned: bool | None = None          # True: inside a range an operator's rewind skipped on purpose

    def as_json(self) -> dict:
        data = {"kind": self.kind, "start": self.start, "end": self.end, "count": self.count}
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                data[name] = list(value) if name == "offsets" else value
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Finding":
        offsets = data.get("offsets")
        return cls(data["kind"], data["start"], data["end"], data["count"],
                   offsets=tuple(offsets) if offsets is not None else None,
                   **{name: data.get(name) for name in _OPTIONAL if name != "offsets"})
