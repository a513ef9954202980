"""The demo's crash schedule: a pure function of the seed, with the classic crash in every run, and the
fault injector's `POINT@N` crashes that carry it out."""
import os
import signal

import pytest

from consumers.demo.classic import DEMO_BATCH_SIZE, DEMO_PIPELINES
from consumers.demo.schedule import CLASSIC_POINTS, crash_schedule, process_specs
from consumers.engine.faults import POINTS, FaultInjector


def schedules(seed, probability=0.2, records=100, max_crashes=30):
    return {demo.name: crash_schedule(seed, demo.name, demo.delivery_mode, demo.crash_points, probability,
                                      records, DEMO_BATCH_SIZE, max_crashes) for demo in DEMO_PIPELINES}


def test_the_same_seed_gives_the_same_crashes_at_the_same_batches():
    assert schedules(1234) == schedules(1234)
    assert process_specs(schedules(1234)["nums-exactly-once"]) == process_specs(schedules(1234)["nums-exactly-once"])


def test_another_seed_gives_another_schedule():
    assert len({str(schedules(seed)) for seed in range(20)}) == 20


@pytest.mark.parametrize("probability", [0.0, 0.2, 0.9])
def test_every_pipeline_crashes_at_its_classic_point_before_its_last_full_batch_for_every_seed(probability):
    for seed in range(300):
        for demo in DEMO_PIPELINES:
            crashes = schedules(seed, probability)[demo.name]
            classic = [c for c in crashes if c.classic]
            assert len(classic) == 1, (seed, demo.name)
            # Every process handles at most one batch per attempt, so attempts below the number of full
            # batches are always reached: the classic crash happens in every run.
            assert classic[0].point in CLASSIC_POINTS[demo.delivery_mode]
            assert 0 <= classic[0].attempt < 100 // DEMO_BATCH_SIZE


def test_with_probability_zero_the_classic_crash_is_the_only_one():
    for seed in range(50):
        assert all(len(crashes) == 1 for crashes in schedules(seed, 0.0).values())


def test_the_probability_adds_crashes_and_max_crashes_caps_them_keeping_the_classic_one():
    busy = schedules(7, probability=0.9)
    assert all(len(crashes) > 5 for crashes in busy.values())
    capped = schedules(7, probability=0.9, max_crashes=2)
    for crashes in capped.values():
        assert len(crashes) == 2 and any(c.classic for c in crashes)


def test_random_crashes_land_anywhere_in_the_cycle_each_mode_passes_and_the_classic_one_at_its_point():
    passed = {"at_most_once": {"after-poll", "after-kafka-commit", "mid-write", "after-write", "after-db-commit"},
              # after-poll would race the writer thread's Kafka commit; after-kafka-commit comes before the write
              "at_least_once": {"mid-write", "after-write", "after-db-commit"},
              "exactly_once": {"after-poll", "mid-write", "after-write", "after-db-commit"}}
    seen = {demo.name: set() for demo in DEMO_PIPELINES}
    for seed in range(50):
        for demo in DEMO_PIPELINES:
            crashes = schedules(seed, 0.5)[demo.name]
            seen[demo.name] |= {c.point for c in crashes}
            assert {c.point for c in crashes if c.classic} <= set(CLASSIC_POINTS[demo.delivery_mode])
    assert seen == {demo.name: passed[demo.delivery_mode] for demo in DEMO_PIPELINES}
    assert all(set(demo.crash_points) <= set(POINTS) for demo in DEMO_PIPELINES)


def test_process_specs_count_batches_since_the_previous_crash():
    crashes = schedules(99, 0.5)["nums-exactly-once"]
    specs = process_specs(crashes)
    assert len(specs) == len(crashes)
    # Process k dies at the n-th pass; the passes add up to the attempt number of its crash.
    total = 0
    for crash, spec in zip(crashes, specs, strict=True):
        point, _, n = spec.partition("@")
        total += int(n)
        assert (point, total - 1) == (crash.point, crash.attempt)


def test_bad_arguments_are_refused():
    demo = DEMO_PIPELINES[0]
    with pytest.raises(ValueError, match="probability"):
        crash_schedule(1, demo.name, demo.delivery_mode, demo.crash_points, 1.5, 100, 10, 3)
    with pytest.raises(ValueError, match="max_crashes"):
        crash_schedule(1, demo.name, demo.delivery_mode, demo.crash_points, 0.2, 100, 10, 0)


def test_a_pass_number_kills_the_process_at_exactly_that_pass(monkeypatch):
    kills = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append(sig))
    faults = FaultInjector.parse("after-write@3")
    assert faults.armed("after-write") and not faults.armed("after-poll")
    for _ in range(2):
        faults.maybe_crash("after-write")
        faults.maybe_crash("after-poll")
    assert kills == []
    faults.maybe_crash("after-write")
    assert kills == [signal.SIGKILL]


@pytest.mark.parametrize("spec", ["after-write@0", "after-write@x", "nowhere@2"])
def test_a_bad_pass_spec_is_refused(spec):
    with pytest.raises(ValueError):
        FaultInjector.parse(spec)
