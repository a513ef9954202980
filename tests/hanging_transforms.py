"""A transform that never returns for one kind of record, for tests of runs stuck in user code (a call to a service
that never answers): `hang:PATH` creates the file PATH, so the test knows the run is inside it, and then blocks for
good. Every other value is an integer, as int_value. No tests here."""
import threading
from pathlib import Path

from consumers.engine.transforms import Transform


def _int_or_hang(record):
    if record.value.startswith(b"hang:"):
        Path(record.value[len(b"hang:"):].decode()).touch()
        threading.Event().wait()
    return ((int(record.value),),)


hangs_on_hang = Transform("hangs_on_hang", (("id", "bigint"),), _int_or_hang)
