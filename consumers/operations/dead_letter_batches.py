"""Replay or discard any number of dead letters: by ids, or every one the list's filters match ("select all
matching"), in calls of MAX_PER_CALL ids in id order. Each call is one audited transaction of
consumers/operations/dead_letters.py, so a batch that fails leaves the batches before it done.

Used by the page, the API, the Django admin and the `dead_letters` command, so they refuse alike (audited,
nothing changed, before the first batch): an id that is not the pipeline's, a selection that matches nothing, and
a selection whose size is no longer the one the operator confirmed (dead letters came or went since they looked).
"""
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from consumers.models import Pipeline
from consumers.operations import actions
from consumers.operations import dead_letter_queries as queries
from consumers.operations import dead_letters as dead_letter_ops
from consumers.operations.errors import Refused

ACTIONS = {"replay": dead_letter_ops.REPLAY, "discard": dead_letter_ops.DISCARD}
# A refusal says its call changed nothing ("Kafka: ...; nothing was changed"): true of that batch, not of the batches
# before it, so the answer for them all quotes the refusal without it.
_NOTHING_CHANGED = re.compile(r"[.;]?\s*nothing was changed\.?", re.IGNORECASE)


@dataclass
class BatchesResult:
    pipeline: str
    action: str                   # replay | discard
    ids: int                      # dead letters asked for
    batches: int
    done: list = field(default_factory=list)   # one DeadLetterResult per committed batch
    failed: str = ""              # why batch len(done) + 1 was refused or failed (the later ones were not tried)
    refused: bool = False         # it was refused (audited), rather than failed and rolled back
    failed_ids: list = field(default_factory=list)   # that batch's ids
    untouched: int = 0            # ids of that batch and the ones after it

    @property
    def counts(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for result in self.done:
            for key, count in result.counts.items():
                totals[key] = totals.get(key, 0) + count
        return totals

    def totals_text(self) -> str:
        return ", ".join(f"{n} {key.replace('_', ' ')}" for key, n in sorted(self.counts.items())) or "nothing"

    def message(self) -> str:
        """One line for a page or a log: what was done and, after a failure, what was not and why. The batches done
        come first, with their action log entries: a refusal's own "nothing was changed" would read as the whole
        action's."""
        if not self.failed:
            return f"{self.action}: {self.ids} dead letter(s) in {self.batches} batch(es): {self.totals_text()}"
        first, last = self.failed_ids[0], self.failed_ids[-1]
        number = len(self.done) + 1
        batches_done = "batch 1" if number == 2 else f"batches 1-{number - 1}"
        entries = ", ".join(f"#{result.action_log.pk}" for result in self.done)
        return (f"{self.action.capitalize()} stopped at batch {number} of {self.batches}. Done and kept: "
                f"{batches_done}, {self.ids - self.untouched} dead letter(s): {self.totals_text()} (action log "
                f"{entries}). Not done: batch {number} ({len(self.failed_ids)} "
                f"id(s), {first}..{last}){' and the ones after it' if number < self.batches else ''}, "
                f"{self.untouched} dead letter(s) untouched, since it was "
                f"{'refused' if self.refused else 'rolled back'}: {self.failed}")

    def as_dict(self) -> dict:
        return {"pipeline": self.pipeline, "action": ACTIONS[self.action], "ids": self.ids, "batches": self.batches,
                "batches_done": len(self.done), "action_ids": [r.action_log.pk for r in self.done],
                "counts": self.counts, "messages": [r.message for r in self.done], "failed": self.failed,
                "untouched": self.untouched, "dead_letters": [o.as_dict() for r in self.done for o in r.outcomes]}


def matching_ids(pipeline: Pipeline, filters: queries.Filters) -> list[int]:
    """The ids of what the list shows with these filters (every page)."""
    return sorted(row["letter_id"] for row in queries.dead_letters(pipeline, filters).iterator())


def act_on_matching(pipeline: Pipeline, action: str, filters: queries.Filters, expected: int | None, *, actor: str,
                    reason: str = "", source: str = "stored", on_batch: Callable | None = None) -> BatchesResult:
    """Every dead letter the filters match. `expected`: the count the operator saw and confirmed; when the
    filters match another number now, refuse (audited) rather than act on a set nobody looked at."""
    ids = matching_ids(pipeline, filters)
    params = {"filters": _filter_params(filters), "expected": expected, "matching": len(ids)}
    if not ids:
        actions.refuse(pipeline, ACTIONS[action], actor, params,
                       f"No {filters.state} dead letters of pipeline {pipeline.name!r} match the filters; "
                       "nothing was changed.")
    if expected is not None and expected != len(ids):
        actions.refuse(pipeline, ACTIONS[action], actor, params, count_moved(expected, len(ids), "match the filters"))
    return act_on_ids(pipeline, action, ids, actor=actor, reason=reason, source=source, on_batch=on_batch)


def count_moved(expected: int, now: int, how: str) -> str:
    """Why a confirmed selection is refused: `now` dead letters `how` (match the filters, are selected), not the
    `expected` the operator confirmed. Every door that confirms a count refuses with this one text."""
    return (f"{now} dead letters {how} now, not the {expected} confirmed: some came or went since. Nothing was "
            "changed; look at the list again and confirm its count.")


def act_on_ids(pipeline, action: str, ids, *, actor: str, reason: str = "", source: str = "stored",
               on_batch: Callable | None = None) -> BatchesResult:
    """Replay or discard `ids` of `pipeline` (a name or a Pipeline) in batches; `on_batch(number, batches, ids,
    result)` after each. Raises Refused when the first call is refused or, with several batches, before it when
    an id is not the pipeline's or discard has no reason."""
    ids = sorted(set(ids))
    size = dead_letter_ops.MAX_PER_CALL
    batches = [ids[i:i + size] for i in range(0, len(ids), size)] or [[]]
    if len(batches) > 1:
        _check_all(pipeline, action, ids, actor=actor, reason=reason, source=source)
    name = pipeline.name if isinstance(pipeline, Pipeline) else pipeline
    outcome = BatchesResult(name, action, len(ids), len(batches))
    for number, batch in enumerate(batches, 1):
        try:
            result = _call(pipeline, action, batch, actor=actor, reason=reason, source=source)
        except Exception as exc:  # that call changed nothing (refused, or rolled back and audited as failed)
            if not outcome.done:
                raise
            outcome.refused = isinstance(exc, Refused)
            outcome.failed = _NOTHING_CHANGED.sub("", str(exc)) if outcome.refused else f"{type(exc).__name__}: {exc}"
            outcome.failed_ids, outcome.untouched = batch, sum(len(b) for b in batches[number - 1:])
            raise BatchesFailed(outcome) from exc
        outcome.done.append(result)
        if on_batch is not None:
            on_batch(number, len(batches), batch, result)
    return outcome


class BatchesFailed(Exception):
    """A batch after the first failed: `outcome` holds what the batches before it did."""

    def __init__(self, outcome: BatchesResult):
        super().__init__(outcome.message())
        self.outcome = outcome


@dataclass
class Attempt:
    """How a dead-letter action ended, read once for every door (page, API, admin, command): done (`result`),
    refused before anything changed (`refusal`, the audited Refused), stopped after some batches that stay done
    (`stopped`), or failed and rolled back, audited as failed (`failed`)."""
    result: object = None
    refusal: Refused | None = None
    stopped: BatchesResult | None = None
    failed: str = ""


def attempt(action: str, call: Callable[[], object]) -> Attempt:
    """Run `call` (a replay or discard of one call or of batches) and say how it ended."""
    try:
        return Attempt(result=call())
    except Refused as exc:   # unknown ids, an empty reason, a count that moved ...: audited, nothing changed
        return Attempt(refusal=exc)
    except BatchesFailed as exc:   # the batches before the failed one stay done
        return Attempt(stopped=exc.outcome)
    except Exception as exc:   # rolled back and audited as failed (a transform that no longer fits the sink)
        return Attempt(failed=f"The {action.replace('_', ' ')} failed and changed nothing: "
                              f"{type(exc).__name__}: {exc}")


def _call(pipeline, action, ids, *, actor, reason, source):
    if action == "replay":
        return dead_letter_ops.replay(pipeline, ids, actor=actor, source=source)
    return dead_letter_ops.discard(pipeline, ids, reason, actor=actor)


def _check_all(pipeline, action, ids, *, actor, reason, source) -> None:
    """Before the first of several batches, what the first call would refuse for all of them."""
    pipeline = actions.lookup(pipeline, ACTIONS[action], actor, {"count": len(ids)})
    params = {"ids": [str(i) for i in ids[:dead_letter_ops.MAX_PER_CALL]], "count": len(ids)}
    if action == "discard":
        params["reason"] = (reason or "").strip()[:dead_letter_ops.MAX_REASON]
        if not params["reason"]:
            actions.refuse(pipeline, ACTIONS[action], actor, params, dead_letter_ops.REASON_NEEDED)
    else:
        params["source"] = source
    dead_letter_ops.refuse_unknown(pipeline, ACTIONS[action], actor, params, ids)


def _filter_params(filters: queries.Filters) -> dict:
    return {key: value for key, value in (("error", filters.error), ("partition", filters.partition),
                                          ("offset_from", filters.offset_from), ("offset_to", filters.offset_to),
                                          ("state", filters.state)) if value not in ("", None)}
