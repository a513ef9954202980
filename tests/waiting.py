"""Waiting for conditions in tests: one helper, and deadlines that only guard against hangs.

A deadline here is never a speed check. Each is what a quiet 2-core machine needs with room to spare,
multiplied by PATIENCE, so the same test passes on a machine loaded by other work (CI neighbours, a
parallel run). Set TALLY_TEST_PATIENCE to scale every deadline at once.
"""
import os

from consumers import waiting

PATIENCE = float(os.environ.get("TALLY_TEST_PATIENCE", "3"))


def patience(seconds: float) -> float:
    """A deadline of `seconds` on a quiet machine, scaled for a loaded one."""
    return seconds * PATIENCE


def wait_for(condition, timeout: float, what: str, interval: float = 0.1):
    """Poll `condition` until it returns something truthy and return that; fail after patience(timeout)."""
    limit = patience(timeout)
    result = waiting.wait_until(condition, limit, interval)
    if not result:
        raise AssertionError(f"timed out after {limit:.0f} s waiting for {what}")
    return result
