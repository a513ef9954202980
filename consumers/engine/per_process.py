"""One object per process, for the engine's process-wide threads (the beat, the parking lot).

A forked child gets its own: the parent's thread did not come along, and its sockets must not be shared.
"""
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    def __init__(self, factory: Callable[[], T]):
        self._factory = factory
        self._lock = threading.Lock()
        self._value: T | None = None
        self._pid = 0

    def get(self) -> T:
        """This process's object, made at the first call."""
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value, self._pid = self._factory(), os.getpid()
            return self._value

    def existing(self) -> T | None:
        """This process's object if it was made, else None."""
        return self._value if self._pid == os.getpid() else None
