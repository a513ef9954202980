"""The garbage collector of a process whose job is running pipelines (`engine_host`, `run_pipeline`).

A batch allocates several containers per record (kafka-python's records, the parsed JSON, the rows) and keeps
them until the batch is written. With the collector's defaults, each batch triggers hundreds of young
collections and a few full ones, and every full one walks the hundred thousand objects Django and the libraries
left at start-up: measured on 100,000 JSON records, 0.2-0.3 s of a 1.3 s run was collection (bench/bench_json.py,
docs/benchmarks.md). So, once, after start-up:
  1. `gc.freeze()` moves what start-up built into the permanent generation, which collections do not walk (what
     Instagram does for its Django workers); a run's own garbage is still collected;
  2. the young generation's threshold is raised, so a batch costs a few collections instead of hundreds; a
     reference cycle that became garbage waits a little longer (a few MB at most).
"""
import gc

YOUNG_THRESHOLD = 20_000  # allocations between young collections (default 700): about one batch's records


def tune_for_engine() -> None:
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
