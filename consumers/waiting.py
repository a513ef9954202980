"""Bounded waits on what another process does: one polling loop for the demo, the engine, rewinds, the broker's
start-up and the tests."""
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], seconds: float, interval: float = 0.2,
               pause: Callable[[float], None] = time.sleep) -> T:
    """Ask `condition` until it returns something truthy, and return that; after `seconds`, return its last
    (falsy) answer. It is asked at least once, the last time at or after the deadline. `pause` is how the caller
    waits between asks (the engine gives up its database turn while it waits)."""
    deadline = time.monotonic() + seconds
    while True:
        answer = condition()
        if answer or time.monotonic() >= deadline:
            return answer
        pause(interval)
