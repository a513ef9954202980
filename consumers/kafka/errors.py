"""The errors of consumers/kafka: one home, so every door (commands, pages, the API, runs) catches the same.

Messages name the cluster and the cause a person can act on; they never hold a secret's value.
"""


class KafkaAdminError(RuntimeError):
    pass


class KafkaUnreachable(KafkaAdminError):
    """The cluster cannot be used now: no broker answers, TLS fails, authentication fails."""


class ClusterConfigError(KafkaUnreachable):
    """A cluster's settings are wrong or incomplete (unknown name, bad value, a missing file or secret)."""

    cause = "settings"

    def __init__(self, cluster: str, problem: str):
        self.cluster, self.problem = cluster, problem
        where = "Kafka clusters file" if cluster == "*" else f"Kafka cluster {cluster!r}"
        super().__init__(f"{where}: {problem}")


class ClusterUnavailable(KafkaUnreachable):
    """A step of connecting failed: `step` is resolve, connect, tls, authenticate or metadata; `cause` is
    what a person acts on: unreachable, TLS verification, authentication."""

    def __init__(self, cluster: str, step: str, cause: str, detail: str):
        self.cluster, self.step, self.cause, self.detail = cluster, step, cause, detail
        super().__init__(f"Kafka cluster {cluster!r}: {cause} ({step} failed): {detail}")
