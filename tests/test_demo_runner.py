"""The demo runner starts a pipeline process again when it fails for a reason other than a scheduled
crash (a loaded machine can fail a start), a bounded number of times, and then reports the failure."""
from consumers.demo.classic import DemoPipeline, count_sink
from consumers.demo.runner import MAX_FAILED_STARTS, DemoRunner


def test_a_failing_process_is_started_again_then_reported_failed_with_its_output():
    failing = DemoPipeline("nums-broken", "exactly_once", "demo_nums_broken", ("after-write",),
                           command="no_such_command")
    updates = []
    runner = DemoRunner([failing], {"nums-broken": ()}, 10, lambda table: count_sink(table, 10), updates.append)
    status = runner.run(timeout_s=120)["nums-broken"]
    assert status["state"] == "failed" and status["failed_starts"] == MAX_FAILED_STARTS
    assert "no_such_command" in status["error"]
    events = [event for _, event in status["timeline"]]
    assert events == ["started", "failed, started again"] * MAX_FAILED_STARTS + ["started", "failed"]
    assert updates and updates[-1]["nums-broken"]["state"] == "failed"
