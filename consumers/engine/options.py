"""What a run is asked to do, and the one interface both engines (consumers/engine/python.py, spark.py) offer.

`RunOptions` is the one spelling of a run's options; `PipelineEngine` is what `engine_for(engine)` returns: a
callable taking the pipeline's name and its options (not `Engine`: that name is the pipeline field's choices).
Each engine's `run_pipeline(name, **options)` (`with_keywords(run)`) builds the options from keywords, for callers
that name only a few of them; `run_engine` is what both engines' `run` do.
"""
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from consumers.engine.faults import NO_FAULTS, FaultInjector
from consumers.engine.lifecycle import RunEnded, RunResult, ended_at_start, load_pipeline

PEERS_WAIT_S = 30.0   # runs started together wait at most this long for each other (python engine, run tasks)


class StopEvent(threading.Event):
    """A run's stop flag that keeps why it was set, for the run's end reason: a bare "stopped" does not say
    that the run's worker went away or shut down."""

    def __init__(self):
        super().__init__()
        self.reason = ""

    def stop(self, reason: str = "") -> None:
        self.reason = self.reason or reason
        self.set()


def why_stopped(stop, detail: str = "") -> str:
    """A stopped run's end detail: why its stop flag was set (a StopEvent's reason), then `detail`."""
    return "; ".join(part for part in (getattr(stop, "reason", ""), detail) if part)


@dataclass(frozen=True)
class RunOptions:
    stop: threading.Event | None = None       # set it to end the run cleanly after the batch in hand
    batch_size: int | None = None             # records per batch (per trigger on Spark); None: the pipeline's
    delay_ms: int = 0                         # simulated work per record, to watch a run go (the demo's pace)
    stop_when_caught_up: bool = False         # end once every partition's position reaches its log end
    max_seconds: float | None = None          # end after this long, whatever is left
    faults: FaultInjector = NO_FAULTS         # crash points, for the chaos tests
    task_id: str = ""                         # the Celery task that runs it, kept on the run's row
    epoch: int | None = None                  # the epoch it was started for (a run task's); None: the current one
    peers: int = 0                            # python: one of this many runs started together (--processes)
    on_worker_death: Callable[[], None] | None = None   # spark: called once per Python worker that died committing


class PipelineEngine(Protocol):
    def __call__(self, name: str, options: RunOptions) -> RunResult:
        """Run pipeline `name` until stopped, fenced, caught up (if asked) or out of time."""


class EngineRun(Protocol):
    """One run of a pipeline on an engine, built for the pipeline at its epoch; building it may refuse the
    pipeline (RunEnded, e.g. its table no longer fits its mapping)."""

    def __init__(self, pipeline, options: RunOptions): ...

    def run(self) -> RunResult: ...


def run_engine(engine_run: type[EngineRun], engine: str, name: str, options: RunOptions) -> RunResult:
    """What each engine's `run` does: join the pipeline at the options' epoch, build the engine's run, run it. A
    run refused while being built ends as one that began would (lifecycle.ended_at_start)."""
    pipeline = load_pipeline(name, options.epoch)
    try:
        run = engine_run(pipeline, options)
    except RunEnded as ended:
        return ended_at_start(pipeline, engine, options.task_id, ended)
    return run.run()


def with_keywords(run: PipelineEngine) -> Callable[..., RunResult]:
    """An engine's `run` taking the options as keywords (RunOptions' fields), for callers that name only a few."""
    def run_pipeline(name: str, **options) -> RunResult:
        return run(name, RunOptions(**options))

    run_pipeline.__wrapped__ = run   # inspect.unwrap(engine.run_pipeline) is the engine's run
    return run_pipeline


def engine_for(engine: str) -> PipelineEngine:
    """The engine of a pipeline's `engine` field. Imported lazily: Spark (and its JVM) loads only where a Spark
    pipeline runs."""
    from consumers.models import Engine

    if engine == Engine.SPARK:
        from consumers.engine.spark import run
    else:
        from consumers.engine.python import run
    return run
