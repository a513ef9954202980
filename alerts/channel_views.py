"""The Channels page: everyone signed in sees the channels (masked, with their state); operators add, change,
test and delete them. A viewer's attempt and bad input are refused and written to the action log."""
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from alerts import channel_actions
from alerts.channel_forms import ChannelForm
from alerts.models import Channel
from alerts.pages import render_form
from consumers.access import can_operate, form_errors, record_refusal
from consumers.form_errors import add_problems

VIEWER_REFUSAL = "You are a viewer: only operators can add, change, test or delete alert channels."


def _refuse_viewer(request, action: str):
    record_refusal(request.user, action, "viewer role: " + VIEWER_REFUSAL, params={"path": request.path})
    return render(request, "alerts/channels.html", _list_context(request, error=VIEWER_REFUSAL), status=403)


def _list_context(request, **extra) -> dict:
    channels = list(Channel.objects.prefetch_related("rules"))
    return {"channels": [(c, c.as_json()) for c in channels], "can_operate": can_operate(request.user),
            "nav": "alerts", **extra}


@require_GET
@login_required
def channel_list(request):
    return render(request, "alerts/channels.html", _list_context(request))


@require_http_methods(["GET", "POST"])
@login_required
def channel_edit(request, name=None):
    channel = get_object_or_404(Channel, name=name) if name else None
    action = "alert_channel_add" if channel is None else "alert_channel_change"
    if request.method == "POST" and not can_operate(request.user):
        return _refuse_viewer(request, action)
    form = ChannelForm(request.POST or None, instance=channel)
    if request.method == "POST":
        if form.is_valid():
            saved = form.save(commit=False)
            try:
                channel_actions.save(saved, request.user.get_username(), list(form.cleaned_data["rules"]))
            except channel_actions.ChannelInvalid as exc:
                add_problems(form, exc)
            else:
                messages.success(request, f"Alert channel {saved.name!r} {'added' if channel is None else 'saved'}.")
                return redirect("alerts:channels")
        record_refusal(request.user, action, f"bad input: {form_errors(form)}",
                       params={"channel": request.POST.get("name", "") or (name or "")})
    return render_form(request, "alerts/channel_form.html", {"form": form, "channel": channel})


def _operator_post(action: str):
    """A POST about one channel that only operators may send: a viewer's is refused (403) and audited."""
    def decorate(view):
        @require_POST
        @login_required
        @wraps(view)
        def checked(request, name):
            channel = get_object_or_404(Channel, name=name)
            if not can_operate(request.user):
                return _refuse_viewer(request, action)
            return view(request, channel)
        return checked
    return decorate


@_operator_post("alert_channel_test")
def channel_test(request, channel):
    ok, answer = channel_actions.test(channel, request.user.get_username())
    (messages.success if ok else messages.error)(request, f"Test of {channel.name}: {answer}")
    return redirect("alerts:channels")


@_operator_post("alert_channel_delete")
def channel_delete(request, channel):
    closed = channel_actions.delete(channel, request.user.get_username())
    before = f" Before that: {closed}." if closed else ""
    messages.success(request, f"Alert channel {channel.name!r} deleted.{before}")
    return redirect("alerts:channels")
