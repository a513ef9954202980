"""What the alerts pages share."""
from django.shortcuts import render

from consumers.access import can_operate


def render_form(request, template: str, context: dict):
    """A form page of the alerts section: 400 when a POST comes back to it (its input was refused), else 200."""
    status = 400 if request.method == "POST" else 200
    return render(request, template, {**context, "nav": "alerts", "can_operate": can_operate(request.user)},
                  status=status)
