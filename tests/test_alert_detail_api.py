"""GET /api/alerts/ID/ answers one page of the alert's notifications, newest first, with their count and the
next page's link (as the dead-letter API pages): an alert firing for months has thousands."""
from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import Notification, NotificationKind
from tests.alert_rows import open_alert
from tests.views_helpers import client_of, make_viewer

pytestmark = pytest.mark.django_db
REMINDERS = 130


@pytest.fixture
def long_firing():
    alert = open_alert("orders")
    start = timezone.now() - timedelta(days=90)
    Notification.objects.bulk_create(
        Notification(alert=alert, kind=NotificationKind.FIRED if n == 0 else NotificationKind.REMINDER, sequence=n,
                     subject="s", body_text="", body_html="", created_at=start + timedelta(hours=n),
                     next_attempt_at=start, delivered_at=start + timedelta(hours=n))
        for n in range(REMINDERS + 1))
    return alert


def test_the_detail_answers_the_newest_notifications_and_how_many_there_are(long_firing):
    detail = client_of(make_viewer()).get(f"/api/alerts/{long_firing.pk}/").json()
    assert detail["notifications_count"] == REMINDERS + 1
    assert [n["sequence"] for n in detail["notifications"]] == list(range(REMINDERS, REMINDERS - 50, -1))
    assert detail["notifications_pages"] == 3 and detail["notifications_page"] == 1


def test_a_client_pages_through_every_notification_by_following_next(long_firing):
    client = client_of(make_viewer())
    url, seen = f"/api/alerts/{long_firing.pk}/?limit=60", []
    while url:
        page = client.get(url).json()
        assert len(page["notifications"]) <= 60
        seen += [n["sequence"] for n in page["notifications"]]
        url = page["notifications_next"]
    assert seen == list(range(REMINDERS, -1, -1))


def test_a_page_past_the_last_is_empty_and_bad_paging_is_refused_naming_the_field(long_firing):
    client = client_of(make_viewer())
    past = client.get(f"/api/alerts/{long_firing.pk}/?page=99").json()
    assert past["notifications"] == [] and past["notifications_next"] is None
    assert past["notifications_count"] == REMINDERS + 1
    for query, field in (("limit=0", "limit"), ("limit=100000", "limit"), ("page=0", "page"), ("page=x", "page")):
        refused = client.get(f"/api/alerts/{long_firing.pk}/?{query}")
        assert refused.status_code == 400 and field in refused.json()["errors"], query
