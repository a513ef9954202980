"""Helpers for the admin's tests: staff users in each role, and posting a changelist action. No tests here."""
from django.contrib.admin import helpers

from tests.views_helpers import make_operator, make_viewer


def staff(user):
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    return user


def staff_operator(username="otto"):
    return staff(make_operator(username))


def staff_viewer(username="vera"):
    return staff(make_viewer(username))


def post_action(client, changelist: str, action: str, ids, **fields):
    """Post an admin action as the changelist (or its intermediate page) does."""
    data = {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(i) for i in ids], **fields}
    return client.post(changelist, data, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []
