"""A topic check whose task no worker will ever take (a worker killed as it took the task, before it claimed the
check; the broker lost its data or was purged) ends as failed with the reason, instead of "queued" for ever. A check
whose queue still holds tasks is left queued however long it waits: a long queue behind busy workers is not a dead
worker. `now` is passed in: nothing here waits for the patience to run out."""
from datetime import timedelta

import pytest
from django.utils import timezone

from consumers.models import Pipeline, TopicCheckJob, TopicCheckStatus
from consumers.reconciliation.topic_check import RUN_TOPIC_CHECK_TASK, fail_lost_checks
from tests.conftest import drop_broker_connections

pytestmark = pytest.mark.django_db(transaction=True)
REDELIVERY, LEASE = 60, 30
PATIENCE = timedelta(seconds=REDELIVERY + LEASE)
SECOND = timedelta(seconds=1)


@pytest.fixture
def check_queue(celery_app_for_tests, settings):
    """The queue topic checks are sent to, in the test Redis, emptied before and after."""
    settings.TALLY_TASK_REDELIVERY_SECONDS = REDELIVERY
    settings.TALLY_TOPIC_CHECK_LEASE_SECONDS = LEASE
    queue = celery_app_for_tests.conf.task_default_queue
    with celery_app_for_tests.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)
    yield celery_app_for_tests
    with celery_app_for_tests.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)


@pytest.fixture
def orders():
    return Pipeline.objects.create(name="orders", topic="orders", sink_table="orders_sink")


def queued_check(pipeline, created_at) -> TopicCheckJob:
    return TopicCheckJob.objects.create(pipeline=pipeline, topic=pipeline.topic, group_id=pipeline.group_id,
                                        table=pipeline.sink_table, key_column="value", created_at=created_at)


def test_a_queued_check_whose_task_is_gone_is_failed_once_a_redelivery_would_have_come_and_not_before(
        orders, check_queue):
    requested = timezone.now()
    check = queued_check(orders, requested)

    assert fail_lost_checks(requested + PATIENCE - SECOND) == 0
    check.refresh_from_db()
    assert (check.status, check.error, check.finished_at) == (TopicCheckStatus.QUEUED, "", None)

    later = requested + PATIENCE + SECOND
    assert fail_lost_checks(later) == 1
    check.refresh_from_db()
    assert (check.status, check.finished_at) == (TopicCheckStatus.FAILED, later)
    assert check.error == (f"no worker took it within {REDELIVERY + LEASE} s and its task is no longer queued "
                           "(a worker died as it took it, or the task broker lost it); request it again")


def test_a_queued_check_behind_a_queue_of_tasks_is_left_queued_however_long_it_waits(orders, check_queue):
    long_ago = timezone.now() - timedelta(days=1)
    check = queued_check(orders, long_ago)
    check_queue.signature(RUN_TOPIC_CHECK_TASK, args=(check.pk,)).delay()   # its task waits behind busy workers

    assert fail_lost_checks(timezone.now()) == 0
    check.refresh_from_db()
    assert check.status == TopicCheckStatus.QUEUED


def test_with_the_broker_unreachable_a_queued_check_is_left_queued(orders, check_queue):
    check = queued_check(orders, timezone.now() - timedelta(days=1))
    working = check_queue.conf.broker_url
    check_queue.conf.broker_url = "redis://127.0.0.1:1/0"   # nothing listens there
    drop_broker_connections(check_queue)
    try:
        assert fail_lost_checks(timezone.now()) == 0
    finally:
        check_queue.conf.broker_url = working
        drop_broker_connections(check_queue)
    check.refresh_from_db()
    assert check.status == TopicCheckStatus.QUEUED


def test_the_beat_fails_queued_checks_whose_task_is_lost_and_leaves_running_ones_to_their_lease(orders, check_queue):
    from consumers.tasks.spark import fail_stale_topic_checks_task

    long_ago = timezone.now() - timedelta(days=1)
    lost = queued_check(orders, long_ago)
    running = queued_check(orders, long_ago)
    TopicCheckJob.objects.filter(pk=running.pk).update(status=TopicCheckStatus.RUNNING, heartbeat_at=timezone.now())

    assert fail_stale_topic_checks_task() == 1
    statuses = dict(TopicCheckJob.objects.values_list("pk", "status"))
    assert statuses == {lost.pk: TopicCheckStatus.FAILED, running.pk: TopicCheckStatus.RUNNING}
