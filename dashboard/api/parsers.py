"""The JSON body parser of every API view (settings.REST_FRAMEWORK: the alerts API and the token endpoint
included): bounded in size and depth, and refusing strings PostgreSQL cannot store, so that any body is
answered with a 400 or 413 that says why before a view sees it.

Without it, `"[" * 100000 + "]" * 100000` made `json` recurse until RecursionError (a 500), and a field
name holding a lone surrogate reached the action log's INSERT (a 500 too).
"""
import codecs
import json

from django.conf import settings
from django.contrib.auth import get_user
from django.http import Http404
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser
from rest_framework.permissions import SAFE_METHODS
from rest_framework.views import exception_handler

from consumers.pg_text import unstorable

# No Tally endpoint takes more than an object holding a list or an object: 32 levels leave ample room.
MAX_DEPTH = 32


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class UnstorableField(APIException):
    """A string PostgreSQL cannot store: a 400 naming the field, in the shape of the serializers' errors."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "unstorable"

    def __init__(self, where: str, problem: str):
        field = where.removeprefix("body.").split(".")[0].split("[")[0] if where.startswith("body.") else ""
        super().__init__({"errors": {field or "non_field_errors": [
            {"message": f"{where} {problem}.", "code": self.default_code}]}})


def check_body(value, max_depth: int = MAX_DEPTH) -> None:
    """Refuse a parsed JSON body nested deeper than `max_depth` (ParseError), or holding a string, key or value,
    that PostgreSQL cannot store (UnstorableField, naming where). Iterative: no recursion, whatever the input."""
    stack = [(value, "body", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            problem = unstorable(item)
            if problem:
                raise UnstorableField(where, problem)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise ParseError(f"The body nests deeper than {max_depth} levels.")
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = unstorable(key)
                    if problem:
                        raise UnstorableField(where, f"has a field name that {problem}")
                    stack.append((child, f"{where}.{key}", depth + 1))
            else:
                stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")  # NaN and Infinity (RFC 8259), as DRF's strict mode


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return self._parse(stream, parser_context or {})
        except APIException as exc:  # refused like any bad input: audited (audited_exception_handler), answered
            exc.refused_body = True
            raise

    def _parse(self, stream, parser_context: dict):
        limit = settings.TALLY_MAX_BODY_BYTES
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise BodyTooLarge(f"The body is larger than {limit} bytes.")
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(codecs.decode(body, encoding), parse_constant=_refuse_constant)
        except RecursionError:  # the C scanner stops at the interpreter's recursion limit, cleanly
            raise ParseError(f"The body nests deeper than {MAX_DEPTH} levels.") from None
        except (ValueError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        check_body(data)
        return data


def _text_of(detail) -> str:
    if isinstance(detail, dict):
        errors = detail.get("errors", detail)
        return "; ".join(f"{field}: {' '.join(e['message'] for e in problems)}" for field, problems in errors.items())
    return str(detail)


def audited_exception_handler(exc, context):
    """DRF's answer to an exception, and the audit of a body the parser refused.

    The audit waits until here because it reads request.user: during parsing, a session's CSRF check reads
    request.POST, which parses the same body again, and again, until RecursionError (a 500). By now DRF has set
    the failed body aside (empty data). A parse error raised inside that check left the request unauthenticated,
    so it is authenticated again, CSRF check included; when that refuses (a session POST without its CSRF token),
    that refusal is the answer."""
    from consumers.api_base import refuse

    request = context.get("request")
    if getattr(exc, "refused_body", False) and request is not None:
        try:
            _authenticate_again(request)
        except APIException as refused:
            return exception_handler(refused, context)
        refuse(request, f"bad input: {_text_of(exc.detail)}", context.get("kwargs") or {})
    elif isinstance(exc, Http404) and request is not None and request.method not in SAFE_METHODS:
        # An action on a pipeline, group, watch or alert that does not exist is refused like any other.
        refuse(request, f"not found: {exc or 'no such object'}", context.get("kwargs") or {})
    return exception_handler(exc, context)


def _authenticate_again(request) -> None:
    if request.user is not None and request.user.is_authenticated:
        return
    # The failed authentication also emptied Django's request.user: read the session's user back (as Django's
    # AuthenticationMiddleware does), then let each authenticator, CSRF check included, decide again.
    request._request.user = get_user(request._request)
    for authenticator in request.authenticators:
        found = authenticator.authenticate(request)
        if found is not None:
            request.user, request.auth = found
            return
