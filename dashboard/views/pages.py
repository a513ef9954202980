"""Full pages of the dashboard."""
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from consumers.models import Pipeline


@require_GET
@login_required
def overview(request):
    return render(request, "overview.html", {"pipelines": Pipeline.objects.order_by("name")})
