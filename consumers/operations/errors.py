"""The refusal every operation raises (offset moves, rewinds, group resets, dead-letter actions, pipeline actions):
bad input or an unsafe moment, nothing changed. `actions.refuse` records it in the action log first and attaches
that entry (`action_log`), so a door can name it."""


class Refused(Exception):
    """Bad input or an unsafe moment: nothing was changed. The message says why, for the operator."""


class NotFound(Refused):
    """What the request names does not exist (a consumer group Kafka has no trace of): doors answer 404."""


class Invalid(ValueError):
    """A spec (of a pipeline, a watch) that cannot be applied: `problems` maps a field to what is wrong and what
    to do. Every door shows each problem beside its field."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems.items()))
