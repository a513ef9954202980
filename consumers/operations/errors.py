"""What every operation raises when it says no, nothing changed.

- `Refused` (offset moves, rewinds, group resets, dead-letter actions, pipeline actions): bad input or an unsafe
  moment. `actions.refuse` records it in the action log first and attaches that entry (`action_log`), so a door
  can name it. `NotFound` (doors answer 404) and `Unavailable` (Kafka could not be used: 503) are kinds of it;
  `as_refusal` turns a Kafka error (`KAFKA_ERRORS`) into the refusal it means (wrong cluster settings: a plain one).
- `Invalid`: a spec's or an input's problems by field (pipelines, watches, channels, offset moves, dead-letter
  ranges), shown beside each field by every door.
- `DeleteRefused`: a pipeline or watch that cannot be deleted."""
from kafka.errors import KafkaError

from consumers.kafka.errors import ClusterConfigError, KafkaAdminError

# What a Kafka call may raise: Tally's own errors (unreachable, refused) and kafka-python's (a broker that went
# down after the cluster's check passed, a request the broker refuses).
KAFKA_ERRORS = (KafkaAdminError, KafkaError)


class Refused(Exception):
    """Bad input or an unsafe moment: nothing was changed. The message says why, for the operator."""


class NotFound(Refused):
    """What the request names does not exist (a consumer group Kafka has no trace of): doors answer 404."""


class Unavailable(Refused):
    """Kafka could not be used (unreachable, TLS, authentication) or refused a request: nothing was changed.
    Doors that tell it apart answer 503; the others show it as any refusal."""

    @classmethod
    def of(cls, exc: Exception) -> "Unavailable":
        # Tally's Kafka errors are written for people; kafka-python's are known by their class's name.
        named = isinstance(exc, KafkaAdminError) or type(exc).__name__ in str(exc)
        return cls(f"Kafka: {exc if named else f'{type(exc).__name__}: {exc}'}; nothing was changed")


def as_refusal(exc: Exception) -> Refused:
    """A refusal as it is, or a Kafka error (one of KAFKA_ERRORS) as the refusal it means: a cluster's wrong
    settings (a secret file removed, say) a plain one (409: waiting does not cure them), any other the Unavailable
    of Kafka that cannot be used now (503)."""
    if isinstance(exc, Refused):
        return exc
    if isinstance(exc, ClusterConfigError):
        return Refused(f"{exc}; nothing was changed")
    return Unavailable.of(exc)


class Invalid(ValueError):
    """A spec (of a pipeline, a watch) that cannot be applied: `problems` maps a field to what is wrong and what
    to do. Every door shows each problem beside its field."""

    def __init__(self, problems: dict[str, str]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems.items()))


class DeleteRefused(ValueError):
    """A pipeline or watch that cannot be deleted (unknown, or a pipeline not stopped): nothing was deleted."""
