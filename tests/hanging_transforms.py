"""Transforms that never return for one kind of record, for tests of runs stuck in user code (a call to a service
that never answers). `hang:PATH` creates the file PATH, so the test knows the run is inside it, and then blocks for
good; `hang-once:PATH:N` does the same the first time it is seen (PATH does not exist yet) and is the row N from
then on (a service that answers again after a restart). Every other value is an integer, as int_value. No tests
here."""
import threading
from pathlib import Path

from consumers.engine.transforms import Transform


def _hang_for_good(marker: Path):
    marker.touch()
    threading.Event().wait()


def _int_or_hang(record):
    if record.value.startswith(b"hang:"):
        _hang_for_good(Path(record.value[len(b"hang:"):].decode()))
    return ((int(record.value),),)


def _int_or_hang_once(record):
    if record.value.startswith(b"hang-once:"):
        path, value = record.value[len(b"hang-once:"):].decode().rsplit(":", 1)
        if not Path(path).exists():
            _hang_for_good(Path(path))
        return ((int(value),),)
    return ((int(record.value),),)


hangs_on_hang = Transform("hangs_on_hang", (("id", "bigint"),), _int_or_hang)
hangs_once = Transform("hangs_once", (("id", "bigint"),), _int_or_hang_once)
