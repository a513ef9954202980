"""`run_pipeline --processes N` reads every child's pipes at once (consumers/engine/processes.py).

A child that writes more log than a pipe holds (64 KiB) must not block while the parent still waits on an
earlier child: a blocked run holds its partitions until the stall limit. Here the first child waits until the
second has written 256 KiB of log and exited, so it finishes only if the second was read meanwhile."""
import sys

from consumers.engine.processes import run_children

# Waits (up to 60 s) for the marker file the second child writes last, then exits 0; 3 if it never came.
FIRST = """
import os, sys, time
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)
print('{"committed": 1}')
"""
# 256 KiB of log lines, an error line, then the marker.
SECOND = """
import sys
for i in range(4096):
    sys.stderr.write("log line %05d " % i + "x" * 48 + "\\n")
sys.stderr.write("CommandError: the second run gave up\\n")
open(sys.argv[1], "w").close()
print('{"committed": 2}')
sys.exit(1)
"""


def test_a_later_child_with_a_long_log_is_read_while_an_earlier_one_runs(tmp_path, capfd):
    marker = str(tmp_path / "second-done")
    first, second = run_children([[sys.executable, "-c", FIRST, marker],
                                  [sys.executable, "-c", SECOND, marker]])

    assert (first.exit_code, first.result, first.error) == (0, {"committed": 1}, "")
    assert (second.exit_code, second.result) == (1, {"committed": 2})
    assert second.error == "CommandError: the second run gave up"
    log = capfd.readouterr().err.splitlines()
    assert [line for line in log if line.startswith("log line")] == [
        f"log line {i:05d} " + "x" * 48 for i in range(4096)]
