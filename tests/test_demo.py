"""The classic example: seeding is safe to repeat, --reset starts over, and the demo run shows loss for
at-most-once, duplicates for at-least-once and every value exactly once for exactly-once."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from consumers.demo.classic import DEMO_PIPELINES, DEMO_TOPIC, DemoError, run_classic_demo, seed_demo
from consumers.kafka import admin as kafka_admin
from consumers.models import ConsumerRun, PartitionOffset, Pipeline
from tests.chaos import sink_counts
from tests.waiting import patience

pytestmark = [pytest.mark.kafka]

CLASSIC = ["nums-at-most-once", "nums-at-least-once", "nums-exactly-once"]  # the kafka-python engine's three


def held_records(topic):
    return {p: w.high - w.log_start for p, w in kafka_admin.watermarks(topic).items()}


def test_seed_demo_creates_the_topic_and_one_pipeline_per_mode_and_is_safe_to_rerun(demo):
    assert seed_demo(records=30, reset=True)["produced"] == 30
    assert seed_demo(records=30)["produced"] == 0
    call_command("seed_demo", "--records", "30")
    assert held_records(DEMO_TOPIC) == {0: 30}
    pipelines = {p.name: p for p in Pipeline.objects.filter(topic=DEMO_TOPIC)}
    assert sorted(pipelines) == sorted(demo.name for demo in DEMO_PIPELINES)
    assert {name: (p.delivery_mode, p.group_id, p.sink_table, p.batch_size) for name, p in pipelines.items()
            if name in CLASSIC} == {
        "nums-at-most-once": ("at_most_once", "nums-at-most-once", "demo_nums_at_most_once", 10),
        "nums-at-least-once": ("at_least_once", "nums-at-least-once", "demo_nums_at_least_once", 10),
        "nums-exactly-once": ("exactly_once", "nums-exactly-once", "demo_nums_exactly_once", 10),
    }
    for pipeline in pipelines.values():
        assert sink_counts(pipeline.sink_table) == {}


def test_seed_demo_refuses_another_record_count_and_reset_starts_over(demo):
    seed_demo(records=30, reset=True)
    first = Pipeline.objects.get(name="nums-exactly-once")
    PartitionOffset.objects.create(pipeline=first, partition=0, next_offset=12)
    ConsumerRun.objects.create(pipeline=first, epoch=0, host="h", pid=1)
    with pytest.raises(DemoError, match="holds 30 records, not 40"):
        seed_demo(records=40)
    with pytest.raises(CommandError, match="--reset"):
        call_command("seed_demo", "--records", "40")
    seed_demo(records=40, partitions=2, reset=True)
    assert held_records(DEMO_TOPIC) == {0: 20, 1: 20}
    assert not PartitionOffset.objects.exists()
    assert Pipeline.objects.filter(topic=DEMO_TOPIC).count() == len(DEMO_PIPELINES)


def test_reset_keeps_the_demo_pipelines_history_and_stops_a_running_one_through_the_audited_action(demo):
    from django.utils import timezone

    from alerts.models import Alert, AlertRule
    from consumers.models import ActionLog, BatchLedger
    from consumers.operations import actions

    seed_demo(records=20, reset=True)
    running = Pipeline.objects.get(name="nums-at-least-once")
    Pipeline.objects.filter(pk=running.pk).update(desired_state="running")
    started = actions.pause(running, actor="alice")
    rule = AlertRule.objects.create(name="demo loss", kind=AlertRule._meta.get_field("kind").choices[0][0],
                                    pipeline=running)
    now = timezone.now()
    alert = Alert.objects.create(rule=rule, pipeline=running, summary="lost 3", started_at=now, last_seen_at=now)
    quiet = Pipeline.objects.get(name="nums-exactly-once")
    quiet_epoch = quiet.epoch
    run = ConsumerRun.objects.create(pipeline=quiet, epoch=quiet_epoch, host="h", pid=1)
    BatchLedger.objects.create(pipeline=quiet, partition=0, first_offset=0, end_offset=10, records=10, rows_written=10,
                               epoch=quiet_epoch)

    summary = seed_demo(records=20, reset=True)

    assert Pipeline.objects.get(pk=running.pk).desired_state == "stopped"
    stop = ActionLog.objects.get(pipeline=running, action="stop")
    assert stop.actor == "demo-reset" and stop.result == "done"
    assert any("nums-at-least-once" in note and f"action log entry {stop.pk}" in note for note in summary["notes"])
    assert ActionLog.objects.filter(pk=started.pk, pipeline=running).exists()
    assert Alert.objects.filter(pk=alert.pk, pipeline=running).exists()
    # The pipeline that was not running is fenced by a new epoch; its state goes, its runs stay, ended.
    assert Pipeline.objects.get(pk=quiet.pk).epoch > quiet_epoch
    assert not BatchLedger.objects.filter(pipeline=quiet).exists()
    run.refresh_from_db()
    assert run.ended_at is not None and run.end_reason == "demo reset"


def recreate_as_auto_creation_does():
    """The demo topic created again with the broker's default partition count (4 here), as a client still reading
    it makes the broker do."""
    from kafka.admin import NewTopic

    with kafka_admin.admin_session() as admin:
        admin.create_topics([NewTopic(DEMO_TOPIC, 4, 1)])


def test_a_topic_a_client_brings_back_during_the_reset_is_deleted_again(demo, monkeypatch):
    # A consumer still reading the topic when the reset deletes it makes the broker create it again, with
    # its default partition count (auto-creation: real Kafka's default, the embedded broker always).
    from consumers.demo import classic

    seed_demo(records=30, reset=True)
    reset = classic._reset

    def reset_then_recreated_by_a_client():
        result = reset()
        recreate_as_auto_creation_does()
        return result

    monkeypatch.setattr(classic, "_reset", reset_then_recreated_by_a_client)
    summary = seed_demo(records=30, reset=True)
    assert kafka_admin.partitions_for(DEMO_TOPIC) == [0]
    assert held_records(DEMO_TOPIC) == {0: 30}
    assert [note for note in summary["notes"] if "came back" in note] == [
        "Topic 'nums' came back with 4 partitions right after the reset deleted it (a client still reading it, "
        "and broker auto-creation): deleted it again."]


def test_a_topic_a_client_brings_back_just_before_the_reset_creates_it_is_replaced(demo, monkeypatch):
    # The same, a moment later: between the reset's last look and its own create_topics.
    from consumers.demo import classic

    seed_demo(records=30, reset=True)
    replace, comebacks = classic._replace_recreated_topic, []

    def then_recreated_by_a_client(partitions):
        notes = replace(partitions)
        if not comebacks:
            comebacks.append(1)
            recreate_as_auto_creation_does()
        return notes

    monkeypatch.setattr(classic, "_replace_recreated_topic", then_recreated_by_a_client)
    summary = seed_demo(records=30, reset=True)
    assert kafka_admin.partitions_for(DEMO_TOPIC) == [0]
    assert held_records(DEMO_TOPIC) == {0: 30}
    assert len([note for note in summary["notes"] if "came back" in note]) == 1


def test_a_topic_delete_the_broker_drops_is_asked_again_until_the_topic_is_gone(demo, monkeypatch):
    # A broker short of CPU can leave a delete undone: the reset asks again instead of giving up.
    from kafka.admin import KafkaAdminClient

    from consumers.demo import classic

    seed_demo(records=30, reset=True)
    delete, asked = KafkaAdminClient.delete_topics, []

    def dropped_the_first_time(admin, topics, **kwargs):
        asked.append(list(topics))
        return None if len(asked) == 1 else delete(admin, topics, **kwargs)

    monkeypatch.setattr(KafkaAdminClient, "delete_topics", dropped_the_first_time)
    monkeypatch.setattr(classic, "TOPIC_DELETE_RETRY_S", 0.5)
    seed_demo(records=20, partitions=2, reset=True)
    assert asked == [[DEMO_TOPIC], [DEMO_TOPIC]]
    assert held_records(DEMO_TOPIC) == {0: 10, 1: 10}


def test_a_topic_that_never_goes_fails_the_reset_and_changes_nothing(demo, monkeypatch):
    from kafka.admin import KafkaAdminClient

    from consumers.demo import classic

    seed_demo(records=30, reset=True)
    PartitionOffset.objects.create(pipeline=Pipeline.objects.get(name="nums-exactly-once"), partition=0,
                                   next_offset=12)
    monkeypatch.setattr(KafkaAdminClient, "delete_topics", lambda admin, topics, **kwargs: None)
    monkeypatch.setattr(classic, "TOPIC_DELETE_RETRY_S", 0.2)
    monkeypatch.setattr(classic, "TOPIC_DELETE_TIMEOUT_S", 1.0)
    with pytest.raises(DemoError, match="Could not delete topic 'nums'.*Timed out after 1 s.*nothing was reset"):
        seed_demo(records=20, partitions=2, reset=True)
    assert held_records(DEMO_TOPIC) == {0: 30}
    assert PartitionOffset.objects.filter(next_offset=12).exists()


def test_a_reset_that_cannot_delete_a_group_moves_its_offsets_to_the_new_topics_start(demo, monkeypatch):
    seed_demo(records=30, reset=True)
    kafka_admin.commit_offsets("nums-at-least-once", DEMO_TOPIC, {0: 30})  # it had read the old topic
    delete_groups = kafka_admin.delete_groups

    def keep_one(groups):  # as Kafka keeps a group with a live member (NonEmptyGroupError)
        deleted = delete_groups([group for group in groups if group != "nums-at-least-once"])
        return {**deleted, "nums-at-least-once": "NonEmptyGroupError"}

    monkeypatch.setattr(kafka_admin, "delete_groups", keep_one)
    summary = seed_demo(records=30, reset=True)
    # Its classic pipeline resumes from this offset: 30 would skip the new topic's every record.
    assert kafka_admin.committed_offsets("nums-at-least-once", DEMO_TOPIC) == {0: 0}
    assert ["Consumer group nums-at-least-once could not be deleted (NonEmptyGroupError); its offsets were set to "
            "the new topic's start."] == [note for note in summary["notes"] if "Consumer group" in note]


def test_the_classic_demo_loses_with_at_most_once_duplicates_with_at_least_once_not_with_exactly_once(demo):
    updates = []
    # Probability 0: each pipeline crashes once, at its classic point, where seed 5 says.
    result = run_classic_demo(records=30, crash_probability=0.0, seed=5, progress=updates.append,
                              timeout_s=patience(180), pipelines=CLASSIC)
    assert sorted(result) == sorted(CLASSIC)
    lost, doubled, exact = (result[name] for name in ("nums-at-most-once", "nums-at-least-once",
                                                       "nums-exactly-once"))
    for outcome in (lost, doubled, exact):
        assert (outcome["state"], outcome["restarts"]) == ("done", 1), outcome
        assert [c["classic"] for c in outcome["crashes"]] == [True]
    # At-most-once committed one batch to Kafka, then died: those ten values never reach the sink.
    attempt = lost["crashes"][0]["attempt"]
    assert lost["missing"] == list(range(10 * (attempt - 1) + 1, 10 * attempt + 1))
    assert lost["duplicated"] == {} and lost["rows"] == 20
    # At-least-once wrote a batch, died before the Kafka commit, and wrote it again.
    assert doubled["missing"] == [] and doubled["duplicated"]
    assert set(doubled["duplicated"].values()) == {2}
    assert (exact["rows"], exact["distinct"], exact["missing"], exact["duplicated"]) == (30, 30, [], {})
    # Each pipeline's counts were reported as soon as it was done, before the run's final report.
    first_done = {name: next(u for u in updates if u[name]["state"] == "done") for name in CLASSIC}
    assert all("rows" in update[name] for name, update in first_done.items())
    assert [event for _, event in exact["timeline"]] == ["started", "crashed", "started", "done"]


def test_a_pipeline_stopped_by_sigterm_is_interrupted_not_done_with_its_unread_values_lost(demo, monkeypatch):
    """A run_pipeline child stopped from outside (SIGTERM) ends cleanly with reason "stopped": the demo must
    not call that finished and count every value it had not read yet as lost."""
    import os
    import signal
    import threading

    from django.db import connection

    from consumers.demo import runner as demo_runner
    from consumers.demo.classic import sink_counts as demo_sink_counts
    from tests.waiting import wait_for

    records, started = 5000, []

    class RecordedCommand(demo_runner.ForkedCommand):
        def __init__(self, args):
            # 1 ms a record: the run lasts seconds, so the sink is seen half full on any machine.
            super().__init__([*args, "--delay-ms", "1"])
            started.append(self)

    def running_child():
        """The newest child once it runs the pipeline (its run row exists: its SIGTERM handler is set) and its
        sink holds some rows but fewer than half."""
        rows = sum(demo_sink_counts("demo_nums_exactly_once").values())
        child = started[-1] if started else None
        if child is None or not 0 < rows < records // 2 or child.process.exitcode is not None:
            return None
        return child if ConsumerRun.objects.filter(pipeline__name="nums-exactly-once", pid=child.process.pid,
                                                   ended_at__isnull=True).exists() else None

    stopped = []

    def stop_it_midway():
        try:
            child = wait_for(running_child, 120, "the exactly-once sink to fill in part", interval=0.05)
            os.kill(child.process.pid, signal.SIGTERM)
            stopped.append(child)
        finally:
            connection.close()

    monkeypatch.setattr(demo_runner, "ForkedCommand", RecordedCommand)
    stopper = threading.Thread(target=stop_it_midway)
    stopper.start()
    result = run_classic_demo(records=records, crash_probability=0.0, seed=5, timeout_s=patience(180),
                              pipelines=["nums-exactly-once"])
    stopper.join()
    outcome = result["nums-exactly-once"]
    assert stopped and stopped[-1] is started[-1], "the child stopped was not the last one started"
    assert outcome["state"] == "interrupted", outcome
    assert "stopped before it caught up" in outcome["error"]
    assert not outcome.get("missing"), "values not read yet were reported lost"
    assert 0 < outcome["rows"] == outcome["distinct"] < records and outcome["duplicated"] == {}
    assert [event for _, event in outcome["timeline"]][-1] == "interrupted"


def test_the_same_seed_repeats_the_same_run(demo):
    first = run_classic_demo(records=30, crash_probability=0.3, seed=77, timeout_s=patience(180), pipelines=CLASSIC[:1])
    again = run_classic_demo(records=30, crash_probability=0.3, seed=77, timeout_s=patience(180), pipelines=CLASSIC[:1])
    name = CLASSIC[0]
    assert first[name]["state"] == again[name]["state"] == "done"
    assert first[name]["crashes"] == again[name]["crashes"]
    assert first[name]["restarts"] == again[name]["restarts"] >= 1
    assert first[name]["missing"] == again[name]["missing"] != []


# Where an at-most-once kill loses its poll: Kafka holds the poll's end, PostgreSQL not yet its rows
# (the engine commits to Kafka, then writes the poll in one transaction; consumers/engine/python.py).
COMMITTED_BEFORE_WRITTEN = {"after-kafka-commit", "mid-write", "after-write"}


def at_most_once_outcome(crashes, records, batch_size):
    """Play the crash schedule against the at-most-once consumer's cycle: each batch attempt polls the
    next `batch_size` records from Kafka's committed offset. A kill after the poll retries it; a kill
    between the Kafka commit and the database commit loses it; after the database commit nothing is lost.
    Returns (the kills reached, the values lost)."""
    by_attempt = {c["attempt"] - 1: c["point"] for c in crashes}   # the page numbers attempts from 1
    position, attempt, kills, lost = 0, 0, 0, []
    while position < records:
        point = by_attempt.get(attempt)
        attempt += 1
        polled = range(position + 1, min(position + batch_size, records) + 1)
        kills += point is not None
        if point == "after-poll":
            continue
        if point in COMMITTED_BEFORE_WRITTEN:
            lost += polled
        position = polled[-1]
    return kills, lost


@pytest.fixture
def demo_state(settings):
    from consumers.demo import runs as demo_runs
    from tests.conftest import TEST_REDIS_URL

    settings.REDIS_URL = TEST_REDIS_URL
    demo_runs._redis().delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)
    yield demo_runs
    demo_runs._redis().delete(demo_runs.STATE_KEY, demo_runs.LOCK_KEY)


def test_the_classic_preset_loses_the_polls_committed_before_their_write_and_shows_the_posts_count_beside(
        demo, demo_state):
    from django.test import Client

    from consumers.demo.classic import DEMO_BATCH_SIZE
    from dashboard.views.demo import CLASSIC_POST, CLASSIC_PRESET
    from tests.views_helpers import make_viewer

    records, seed = CLASSIC_PRESET["records"], CLASSIC_PRESET["seed"]
    demo_state.write_state({"run_id": "classic", "state": "queued", "records": records, "seed": seed,
                            "crash_probability": CLASSIC_PRESET["crash_probability"], "preset": "classic"})
    state = demo_state.run("classic", records, CLASSIC_PRESET["crash_probability"], seed,
                           pipelines=["nums-at-most-once"])
    outcome = state["pipelines"]["nums-at-most-once"]
    assert outcome["state"] == "done", outcome

    kills, lost = at_most_once_outcome(outcome["crashes"], records, DEMO_BATCH_SIZE)
    # The post's setup: the consumer restarted several times, not only where it loses.
    assert outcome["restarts"] == kills >= 3
    assert outcome["missing"] == lost and outcome["duplicated"] == {}
    assert outcome["rows"] == records - len(lost)
    # Loss comes in whole polls here: the preset lands within one poll of the post's count.
    assert abs(records - len(lost) - CLASSIC_POST["received"]) < DEMO_BATCH_SIZE

    viewer = Client()
    viewer.force_login(make_viewer())
    page = viewer.get("/demo/").content.decode()
    assert (f"The post: <b>{CLASSIC_POST['received']} of 100</b> received · "
            f"this run: <b>{records - len(lost)} of 100</b>") in page
