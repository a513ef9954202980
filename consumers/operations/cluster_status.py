"""Every configured Kafka cluster, checked now, with what Tally last saw of it (the last error `kafka check` or a
run recorded): the Clusters page and its API share this. Checks run in parallel, so a page with an unreachable
cluster still answers within one check's time limit (consumers/kafka/check.py)."""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from consumers.kafka import clusters
from consumers.kafka.check import CheckResult, check_cluster
from consumers.kafka.errors import ClusterConfigError
from consumers.models import ClusterStatus, Pipeline, Watch

# Clusters checked at once: each check mostly waits on the network.
CHECK_THREADS = 8


@dataclass
class ClusterState:
    settings: dict            # clusters.describe(): no secret, only where each secret is read from
    check: CheckResult
    status: ClusterStatus
    pipelines: list[str]
    watches: list[str]

    @property
    def name(self) -> str:
        return self.settings["name"]

    def as_json(self) -> dict:
        return {**self.settings, "reachable": self.check.ok, "check": self.check.as_dict(),
                "last_error": self.status.last_error or None,
                "last_error_at": self.status.last_error_at.isoformat() if self.status.last_error_at else None,
                "pipelines": self.pipelines, "watches": self.watches}


def configured() -> tuple[list[clusters.Cluster], str]:
    """The clusters whose settings load, and the error of the clusters file (or of the default cluster's
    settings) when they do not: a broken file must not hide the default cluster."""
    try:
        return clusters.all_clusters(), ""
    except ClusterConfigError as exc:
        try:
            return [clusters.default_cluster()], str(exc)
        except ClusterConfigError as default_error:
            return [], f"{default_error}; {exc}" if str(exc) != str(default_error) else str(exc)


@dataclass
class UnconfiguredCluster:
    """A cluster name pipelines or watches still use that no configured cluster has (the file dropped or renamed
    it): they cannot start, rewind or be checked until it is back under that name."""
    name: str
    pipelines: list[str]
    watches: list[str]

    def as_json(self) -> dict:
        return {"name": self.name, "pipelines": self.pipelines, "watches": self.watches}


def cluster_states() -> tuple[list[ClusterState], str, list[UnconfiguredCluster]]:
    """Check every configured cluster; returns their states, the settings error, and the cluster names in use that
    none of them has. Nothing is recorded: the page and the API are GETs, and a GET never writes (a crawler
    reloading the page would rewrite what `kafka check` and the runs remembered). The check shown is the live
    one."""
    found, error = configured()
    with ThreadPoolExecutor(max_workers=max(1, min(CHECK_THREADS, len(found)))) as pool:
        results = list(pool.map(check_cluster, found))
    statuses = {s.name: s for s in ClusterStatus.objects.filter(name__in=[c.name for c in found])}
    pipelines, watches = _names_by_cluster(Pipeline), _names_by_cluster(Watch)
    states = [ClusterState(clusters.describe(c), r, statuses.get(c.name) or ClusterStatus(name=c.name),
                           pipelines.get(c.name, []), watches.get(c.name, []))
              for c, r in zip(found, results, strict=True)]
    unconfigured = [UnconfiguredCluster(name, pipelines.get(name, []), watches.get(name, []))
                    for name in sorted((set(pipelines) | set(watches)) - {c.name for c in found})]
    return states, error, unconfigured


def _names_by_cluster(model) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, cluster in model.objects.order_by("name").values_list("name", "cluster"):
        found.setdefault(cluster, []).append(name)
    return found
