"""Who may do what (consumers/access.py) and the record of every refusal: one module behind every door.
A user without a role sees only a page saying so (the API and /metrics included); viewers are refused on the
alert pages like everywhere else, audited; refusals are stored whatever they hold; API tokens never show in
the admin's list."""
import pytest
from django.contrib.auth.models import User
from django.test import Client
from knox.models import AuthToken

from alerts.models import Alert, Mute
from consumers.access import can_operate, can_view, record_refusal, role_of
from consumers.models import ActionLog, ActionResult, Pipeline
from tests.alert_rows import open_alert
from tests.views_helpers import (
    PASSWORD,
    api_token,
    client_of,
    make_operator,
    make_pipeline,
    make_superuser,
    make_viewer,
)


@pytest.fixture
def nobody(db):
    """Signed in, in no group, with no permission."""
    return User.objects.create_user("nadia", password=PASSWORD)


def test_roles_are_decided_in_one_place(db, nobody):
    viewer, operator = make_viewer(), make_operator()
    assert [role_of(u) for u in (nobody, viewer, operator)] == ["none", "viewer", "operator"]
    assert (can_view(nobody), can_view(viewer), can_operate(viewer), can_operate(operator)) == (False, True, False,
                                                                                                 True)
    staff = User.objects.create_user("sam", password=PASSWORD, is_staff=True)
    assert role_of(staff) == "none"  # being staff gives no role: the permissions do


def test_a_refusal_is_stored_cleaned_and_cut_to_its_columns_and_never_raises(db):
    pipeline = make_pipeline(with_history=False)
    entry = record_refusal("a\x00" * 200, "act\ud800" * 20, "why\x00 \udfff" + "x" * 5000, pipeline=pipeline,
                           group_id="g\x00" * 300, params={"k\ud800": "v\x00" * 500, "n": [1, "\ud800"]})
    entry.refresh_from_db()
    assert entry.result == ActionResult.REFUSED and entry.finished_at is not None
    assert len(entry.actor) == 150 and entry.actor.startswith("a\\x00")
    assert len(entry.action) == 30 and entry.action.startswith("act\\ud800")
    assert len(entry.group_id) == 255 and "\x00" not in entry.group_id
    assert entry.message.startswith("why\\x00 \\udfff") and len(entry.message) > 2000  # a TextField: not cut
    assert entry.params == {"k\\ud800": ("v\\x00" * 500)[:200], "n": [1, "\\ud800"]}


def test_a_refusal_that_cannot_be_written_is_logged_not_raised(db, monkeypatch, caplog):
    from django.db import DatabaseError

    def broken(*args, **kwargs):
        raise DatabaseError("disk full")

    monkeypatch.setattr(ActionLog.objects, "create", broken)
    assert record_refusal("otto", "start", "no") is None
    assert "could not record the refusal of start by otto" in caplog.text


@pytest.mark.parametrize("url", ["/", "/pipelines/orders/", "/action-log/", "/groups/", "/alerts/", "/alerts/rules/",
                                 "/topic-checks/", "/demo/", "/metrics", "/api/docs/", "/watches/", "/clusters/",
                                 "/pipelines/new/", "/watches/new/", "/alerts/channels/", "/groups/orders/",
                                 "/pipelines/orders/dead-letters/", "/pipelines/orders/rewind/"])
def test_a_user_without_a_role_sees_only_a_page_saying_so(nobody, url):
    make_pipeline(with_history=False)
    response = client_of(nobody).get(url)
    assert response.status_code == 403, (url, response.status_code)
    body = response.content.decode()
    assert "no role" in body.lower() and "orders" not in body
    refusal = ActionLog.objects.get()
    assert (refusal.actor, refusal.action, refusal.result) == ("nadia", "view", ActionResult.REFUSED)


@pytest.mark.parametrize("url", ["/api/", "/api/pipelines/", "/api/pipelines/orders/", "/api/action-log",
                                 "/api/alerts/", "/api/me", "/api/schema/"])
def test_the_api_refuses_a_user_without_a_role_by_session_and_by_token(nobody, url):
    make_pipeline(with_history=False)
    key = api_token(nobody)
    by_session = client_of(nobody).get(url)
    by_token = Client().get(url, headers={"Authorization": f"Token {key}"})
    for response in (by_session, by_token):
        assert response.status_code == 403, (url, response.content[:200])
        assert b"orders" not in response.content
        assert b"has no role" in response.content, (url, response.content[:200])   # not "the viewer role"
    assert ActionLog.objects.filter(actor="nadia", action="view", result=ActionResult.REFUSED).count() == 2


def test_metrics_by_token_needs_a_role_too(nobody):
    key = api_token(nobody)
    response = Client().get("/metrics", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 403 and b"tally_" not in response.content
    viewer_key = api_token(make_viewer())
    assert Client().get("/metrics", headers={"Authorization": f"Token {viewer_key}"}).status_code == 200


# WSGI hands a header's bytes over as Latin-1: "é" is the byte 0xe9, which is not UTF-8.
@pytest.mark.parametrize("key", ["caf\u00e9-not-utf8", "abc\x00def", "\u00ff" * 64])
@pytest.mark.parametrize("path", ["/api/me", "/api/pipelines/", "/metrics"])
def test_a_token_key_that_is_not_printable_ascii_is_refused_as_invalid_not_a_500(db, path, key):
    viewer_key = api_token(make_viewer())
    client = Client(raise_request_exception=False)
    response = client.get(path, headers={"Authorization": f"Token {key}"})
    # The API answers 403 to a bad credential (its first scheme, the session's, names no WWW-Authenticate), as
    # for a revoked token; /metrics 401.
    assert response.status_code in (401, 403), (response.status_code, response.content[:200])
    assert client.get(path, headers={"Authorization": f"Token {viewer_key}"}).status_code == 200


@pytest.mark.parametrize("url,data", [("/pipelines/orders/actions/start/", {}),
                                      ("/pipelines/new/", {"name": "x", "topic": "t", "sink_table": "s"}),
                                      ("/api/pipelines/orders/actions/start", {}),
                                      ("/alerts/rules/new/", {"name": "x", "kind": "lost"})])
def test_a_user_without_a_role_is_refused_every_write_and_nothing_changes(nobody, url, data):
    pipeline = make_pipeline(with_history=False)
    response = client_of(nobody).post(url, data)
    assert response.status_code == 403, (url, response.status_code)
    assert Pipeline.objects.get().desired_state == pipeline.desired_state and Pipeline.objects.count() == 1
    assert not ActionLog.objects.exclude(result=ActionResult.REFUSED).exists()
    assert ActionLog.objects.filter(actor="nadia", result=ActionResult.REFUSED).count() == 1


def test_a_user_without_a_role_can_still_sign_out(nobody):
    client = client_of(nobody)
    assert client.post("/accounts/logout/").status_code == 302
    assert "_auth_user_id" not in client.session


def test_a_viewer_still_reads_everything(db):
    make_pipeline(with_history=False)
    client = client_of(make_viewer())
    for url in ("/", "/pipelines/orders/", "/alerts/", "/metrics", "/api/pipelines/"):
        assert client.get(url).status_code == 200, url
    assert not ActionLog.objects.exists()



@pytest.mark.parametrize("path,action", [("/alerts/{alert}/acknowledge/", "acknowledge_alert"),
                                         ("/alerts/{alert}/mute/", "mute_alert"),
                                         ("/alerts/rules/{rule}/mute/", "alert_mute"),
                                         ("/alerts/rules/{rule}/test/", "alert_test"),
                                         ("/alerts/rules/{rule}/", "alert_rule"),
                                         ("/alerts/rules/new/", "alert_rule")])
def test_a_viewers_refusal_on_the_alert_pages_is_audited(db, path, action):
    alert = open_alert("orders")
    response = client_of(make_viewer()).post(path.format(alert=alert.pk, rule=alert.rule_id),
                                             {"minutes": "10", "name": "x", "kind": "lost"})
    assert response.status_code == 403
    refusal = ActionLog.objects.get()
    assert (refusal.actor, refusal.action, refusal.result) == ("vera", action, ActionResult.REFUSED)
    assert not Mute.objects.exists() and Alert.objects.get().acknowledged_at is None


TOKENS = "/admin/knox/authtoken/"


def test_api_tokens_are_listed_masked_in_the_admin_and_shown_once_when_made(db):
    admin = make_superuser()
    operator = make_operator()
    key = api_token(operator)
    token = AuthToken.objects.get(user=operator)
    client = client_of(admin)
    listing = client.get(TOKENS).content.decode()
    assert key not in listing and f"{key[:4]}…" in listing and key[:15] not in listing
    for page in ("change", "delete"):
        detail = client.get(f"{TOKENS}{token.pk}/{page}/")
        assert key.encode() not in detail.content
    made = client.post(f"{TOKENS}add/", {"user": admin.pk}, follow=True).content.decode()
    new = AuthToken.objects.get(user=admin)
    shown = made.split("Token for root: ")[1].split(" ")[0]
    assert shown.startswith(new.token_key) and "not shown again" in made
    assert Client().get("/api/me", HTTP_AUTHORIZATION=f"Token {shown}").status_code == 200
    assert new.expiry is not None   # TALLY_API_TOKEN_TTL_DAYS, as the API's
    assert shown not in client.get(TOKENS).content.decode()
    # Django's own pages that name objects by str(): "Recent actions", and a user's delete page (its token and
    # the admin's log entry of making it) name the token masked.
    assert shown not in client.get("/admin/").content.decode()
    assert f"API token {shown[:4]}… of root" in client.get("/admin/").content.decode()
    for user in (admin, operator):
        page = client.get(f"/admin/auth/user/{user.pk}/delete/").content.decode()
        assert key not in page and shown not in page
    assert f"API token {key[:4]}… of otto" in page   # the operator's, the loop's last page


def test_an_api_token_is_revoked_from_the_admin_audited_without_its_key_in_clear(db):
    admin = make_superuser()
    operator = make_operator()
    key, other = api_token(operator), api_token(operator)
    token = AuthToken.objects.get(token_key=key[:15])
    client = client_of(admin)
    listing = client.get(TOKENS).content.decode()
    page = f"{TOKENS}{token.pk}/revoke/"
    assert page in listing
    confirm = client.get(page)
    assert confirm.status_code == 200 and key not in confirm.content.decode()
    assert f"{key[:4]}…" in confirm.content.decode() and AuthToken.objects.filter(pk=token.pk).exists()
    done = client.post(page, follow=True).content.decode()
    assert "Revoked the API token" in done and key not in done
    assert not AuthToken.objects.filter(pk=token.pk).exists()
    refused = Client().get("/api/me", HTTP_AUTHORIZATION=f"Token {key}")
    assert refused.status_code in (401, 403) and "Invalid token" in refused.content.decode()
    assert Client().get("/api/me", HTTP_AUTHORIZATION=f"Token {other}").status_code == 200  # its other token
    entry = ActionLog.objects.get(action="revoke_token")
    assert (entry.actor, entry.result, entry.params["user"]) == ("root", ActionResult.DONE, "otto")
    assert key[:15] not in str(entry.params) + entry.message


def test_staff_without_the_permission_cannot_revoke_a_token_and_the_refusal_is_audited(db):
    operator = make_operator()
    api_token(operator)
    token = AuthToken.objects.get(user=operator)
    staff = User.objects.create_user("sam", password=PASSWORD, is_staff=True)
    response = client_of(staff).post(f"{TOKENS}{token.pk}/revoke/")
    assert response.status_code == 403 and AuthToken.objects.filter(pk=token.pk).exists()
    refusal = ActionLog.objects.get()
    assert (refusal.actor, refusal.action, refusal.result) == ("sam", "revoke_token", ActionResult.REFUSED)


def test_a_token_made_in_the_admin_is_audited_masked(db):
    admin = make_superuser()
    client_of(admin).post(f"{TOKENS}add/", {"user": admin.pk})
    token = AuthToken.objects.get(user=admin)
    entry = ActionLog.objects.get(action="make_token")
    assert entry.actor == "root" and entry.params["key"] == f"{token.token_key[:4]}…"
    assert token.token_key not in str(entry.params) + entry.message


def user_form(user, **changes) -> dict:
    """The user admin's change form as its page posts it, with `changes`."""
    return {"username": user.username, "first_name": "", "last_name": "", "email": "",
            "is_active": "on", "is_staff": "on", "groups": list(user.groups.values_list("pk", flat=True)),
            "user_permissions": [], "last_login_0": "", "last_login_1": "",
            "date_joined_0": f"{user.date_joined:%Y-%m-%d}", "date_joined_1": "00:00:00", **changes}


def test_a_role_change_in_the_user_admin_is_audited_with_who_whom_and_the_roles_before_and_after(db):
    from django.contrib.auth.models import Group

    from dashboard.roles import OPERATORS
    admin = client_of(make_superuser())
    viewer = make_viewer()
    page = f"/admin/auth/user/{viewer.pk}/change/"

    assert admin.post(page, user_form(viewer, first_name="Vera")).status_code == 302
    assert not ActionLog.objects.exists()   # a change that gives no other role is not a role change

    operators = Group.objects.get(name=OPERATORS)
    assert admin.post(page, user_form(viewer, groups=[operators.pk])).status_code == 302

    assert role_of(User.objects.get(pk=viewer.pk)) == "operator"
    entry = ActionLog.objects.get()
    assert (entry.action, entry.actor, entry.result) == ("change_role", "root", ActionResult.DONE)
    assert entry.params == {"via": "admin", "user": "vera",
                            "before": {"role": "viewer", "groups": ["viewers"], "superuser": False},
                            "after": {"role": "operator", "groups": ["operators"], "superuser": False}}
    assert entry.message == ("changed the role of vera: viewer (groups: viewers) -> operator (groups: operators)")


def test_a_group_change_or_a_deletion_in_the_admin_is_audited_for_each_member_whose_role_it_changed(db):
    from django.contrib.auth.models import Group

    from dashboard.roles import OPERATORS, VIEWERS
    admin = client_of(make_superuser())
    operator, viewer = make_operator(), make_viewer()
    operators = Group.objects.get(name=OPERATORS)

    # The operators group keeps only the viewers' permissions: its member becomes a viewer.
    view_only = list(Group.objects.get(name=VIEWERS).permissions.values_list("pk", flat=True))
    answer = admin.post(f"/admin/auth/group/{operators.pk}/change/", {"name": OPERATORS, "permissions": view_only})
    assert answer.status_code == 302 and role_of(User.objects.get(pk=operator.pk)) == "viewer"
    entry = ActionLog.objects.get(action="change_role")
    assert (entry.actor, entry.params["user"], entry.params["why"]) == ("root", operator.username,
                                                                       "group operators changed")
    assert (entry.params["before"]["role"], entry.params["after"]["role"]) == ("operator", "viewer")

    # Deleting the viewers group leaves its member with no role; deleting a user ends theirs.
    viewers = Group.objects.get(name=VIEWERS)
    assert admin.post(f"/admin/auth/group/{viewers.pk}/delete/", {"post": "yes"}).status_code == 302
    assert admin.post(f"/admin/auth/user/{operator.pk}/delete/", {"post": "yes"}).status_code == 302
    changes = ActionLog.objects.filter(action="change_role").order_by("created_at", "pk")
    assert [(e.params["user"], e.params["before"]["role"], e.params["after"]["role"], e.params["why"])
            for e in changes[1:]] == [(viewer.username, "viewer", "none", "group viewers deleted"),
                                     (operator.username, "viewer", "none", "user deleted")]
