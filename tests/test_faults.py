"""Fault injection says which fault fired before it kills the process (SIGKILL leaves no other trace)."""
import signal
import subprocess
import sys

from tests.conftest import ROOT


def test_a_fired_fault_prints_its_point_then_kills_the_process():
    code = ("from consumers.engine.faults import FaultInjector\n"
            "faults = FaultInjector.parse('after-write:1,after-poll:0')\n"
            "faults.maybe_crash('after-poll')\n"
            "print('survived after-poll', flush=True)\n"
            "faults.maybe_crash('after-write')\n"
            "print('survived after-write', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "survived after-poll\n"
    assert done.stderr.startswith("crash-at: fault after-write fired (p=1): SIGKILL to pid ")
