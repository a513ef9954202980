"""What the alerts pages share."""
from django.contrib import messages
from django.shortcuts import render

from alerts.queries import mute_problem, parse_minutes
from consumers.access import can_operate, record_refusal


def render_form(request, template: str, context: dict):
    """A form page of the alerts section: 400 when a POST comes back to it (its input was refused), else 200."""
    status = 400 if request.method == "POST" else 200
    return render(request, template, {**context, "nav": "alerts", "can_operate": can_operate(request.user)},
                  status=status)


def mute_input(request, action: str, *, pipeline, params: dict) -> tuple[int, str] | None:
    """A mute form's minutes and reason, or None when they are refused: the refusal is audited (as `action`, with
    `params`) and shown as the page's message."""
    minutes, reason = parse_minutes(request.POST.get("minutes")), request.POST.get("reason", "")
    problem = mute_problem(minutes, reason)
    if problem:
        record_refusal(request.user, action, f"bad input: {problem}", pipeline=pipeline,
                       params={**params, "minutes": request.POST.get("minutes", "")})
        messages.error(request, problem)
        return None
    return minutes, reason
