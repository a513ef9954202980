"""The API's documentation page: the OpenAPI schema (drf-spectacular) as a plain HTML page of the
dashboard, so it works offline and without JavaScript from a CDN. The schema itself is at /api/schema/."""
from django.contrib.auth.decorators import login_required
from django.views.decorators.http import require_GET
from drf_spectacular.generators import SchemaGenerator

from dashboard.views.common import render_page

METHODS = ("get", "post", "put", "patch", "delete")


def endpoints(schema: dict) -> list[dict]:
    rows = []
    for route, operations in sorted(schema.get("paths", {}).items()):
        for method in METHODS:
            operation = operations.get(method)
            if operation is None:
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            reference = body.get("schema", {}).get("$ref", "")
            fields = schema.get("components", {}).get("schemas", {}).get(reference.rsplit("/", 1)[-1], {})
            rows.append({"method": method.upper(), "path": route,
                         "summary": (operation.get("description") or "").strip(),
                         "fields": sorted(fields.get("properties", {}).items()),
                         "parameters": [p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"]})
    return rows


@require_GET
@login_required
def api_docs(request):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return render_page(request, "api_docs.html", {"nav": "api", "endpoints": endpoints(schema),
                                                  "title": schema["info"]["title"]})
