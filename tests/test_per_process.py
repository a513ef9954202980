"""consumers/engine/per_process.py: one object per process, a new one in a forked child."""
import os

from consumers.engine.per_process import PerProcess


def test_a_process_gets_one_object_and_a_forked_child_its_own(monkeypatch):
    made = PerProcess(object)
    assert made.existing() is None
    first = made.get()
    assert made.get() is first and made.existing() is first
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)   # as a forked child sees itself
    assert made.existing() is None
    child = made.get()
    assert child is not first and made.get() is child
