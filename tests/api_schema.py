"""The API's OpenAPI schema, built in-process as /api/schema/ serves it, and a check that a Django test-client
response is one the schema documents: its status code is listed for the operation, and its body matches that
status's schema (schemathesis's response validation)."""
import json

import requests
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from schemathesis.core.transport import Response

RAW_SCHEMA = json.loads(json.dumps(SchemaGenerator().get_schema(request=None, public=True), default=str))
SCHEMA = schemathesis.openapi.from_dict(RAW_SCHEMA)


def operation(method: str, template: str):
    """The schema's operation for `template` (a path as the schema writes it, e.g. /api/pipelines/{name}/)."""
    return SCHEMA[template][method.upper()]


def body(response) -> bytes:
    """A test-client response's body, streamed or not."""
    return b"".join(response.streaming_content) if response.streaming else response.content


def assert_documented(op, response, method: str, path: str) -> None:
    """Fails unless the schema lists `response`'s status for `op` and its body matches that answer's schema."""
    status = response.status_code
    content = body(response)
    assert op.responses.find_by_status_code(status) is not None, (
        f"{method} {path}: status {status} is not in the schema", content[:300])
    request = requests.Request(method.upper(), f"http://testserver{path}").prepare()
    headers = {name.lower(): [value] for name, value in response.headers.items()}
    op.validate_response(Response(status_code=status, headers=headers, content=content, request=request,
                                  elapsed=0.0, verify=True, message=response.reason_phrase, http_version="1.1",
                                  encoding="utf-8"))
