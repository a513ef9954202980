"""The JSON body parser of every API view (settings.REST_FRAMEWORK: the alerts API and the token endpoint
included): bounded in size and depth, and refusing strings PostgreSQL cannot store, so that any body is
answered with a 400 or 413 that says why before a view sees it.

Without it, `"[" * 100000 + "]" * 100000` made `json` recurse until RecursionError (a 500), and a field
name holding a lone surrogate reached the action log's INSERT (a 500 too).
"""
import codecs
import json

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from consumers.models.text import unstorable

# No Tally endpoint takes more than an object holding a list or an object: 32 levels leave ample room.
MAX_DEPTH = 32


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


def body_problem(value, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a parsed JSON body is refused (nested deeper than `max_depth`, or a string, key or value, that
    PostgreSQL cannot store), naming where; None if it is fine. Iterative: no recursion, whatever the input."""
    stack = [(value, "body", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            problem = unstorable(item)
            if problem:
                return f"{where} {problem}"
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                return f"the body nests deeper than {max_depth} levels"
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = unstorable(key)
                    if problem:
                        return f"a field name in {where} {problem}"
                    stack.append((child, f"{where}.{key}", depth + 1))
            else:
                stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
    return None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")  # NaN and Infinity (RFC 8259), as DRF's strict mode


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.TALLY_MAX_BODY_BYTES
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise BodyTooLarge(f"The body is larger than {limit} bytes.")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = json.loads(codecs.decode(body, encoding), parse_constant=_refuse_constant)
        except RecursionError:  # the C scanner stops at the interpreter's recursion limit, cleanly
            raise ParseError(f"The body nests deeper than {MAX_DEPTH} levels.") from None
        except (ValueError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = body_problem(data)
        if problem:
            raise ParseError(f"Refused: {problem[0].upper()}{problem[1:]}.")
        return data
