"""Helpers shared by the page views: one URL serves the page and its htmx fragment."""
from django.shortcuts import render
from django.utils.cache import patch_vary_headers


def render_page(request, template: str, context: dict, fragment: str | None = None, status: int = 200):
    """Render the whole page, or only `template#fragment` when htmx asks (and the fragment is named).
    The response varies on HX-Request so no cache hands a fragment to a full-page load."""
    name = f"{template}#{fragment}" if fragment and request.htmx else template
    response = render(request, name, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response
