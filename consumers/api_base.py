"""The JSON API's shared ground, below the apps that serve an API (dashboard, alerts): strict JSON input
(each field one JSON type, unknown fields refused, a 400 naming each bad field, audited) and the role checks
(viewers read, operators act; a user in neither role is refused). Both apps use these, so neither imports the
other."""
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response

from consumers.access import can_operate, can_view, record_refusal, refused_action
from consumers.kafka import clusters


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be a JSON boolean: true or false."}

    def to_internal_value(self, data):
        if type(data) is not bool:
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "Must be a JSON integer."}

    def to_internal_value(self, data):
        if type(data) is not int:
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictStringField(serializers.CharField):
    default_error_messages = {"invalid": "Must be a JSON string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a misspelt `dryrun` is an error, not a silent default."""

    def validate(self, attrs):
        data = getattr(self, "initial_data", None)  # a nested serializer has none: it checks in to_internal_value
        unknown = sorted(set(data) - set(self.fields)) if isinstance(data, dict) else []
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


class EmptyInput(StrictSerializer):
    """Actions (start, stop, ...) take no body: an empty object or nothing."""


class FieldErrorSerializer(serializers.Serializer):
    message = serializers.CharField()
    code = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    """A refusal, for the OpenAPI schema: `error` in Tally's words, or `detail` in Django REST framework's
    (authentication, a body that is not JSON, an unknown id)."""
    error = serializers.CharField(required=False)
    detail = serializers.CharField(required=False)


class FieldErrorsSerializer(ErrorSerializer):
    """A 400: each bad field and its problems (field_errors)."""
    errors = serializers.DictField(child=FieldErrorSerializer(many=True), required=False)


class RefusalSerializer(ErrorSerializer):
    """An audited refusal: nothing changed, and the action log holds why."""
    action_id = serializers.IntegerField(allow_null=True, required=False)


# The refusals an operation may answer, for its OpenAPI responses (answers()).
BAD_INPUT = OpenApiResponse(FieldErrorsSerializer, description="Bad input: each field and what is wrong; nothing "
                                                                "changed")
FORBIDDEN = OpenApiResponse(ErrorSerializer, description="Not signed in, or a role that may not do this; audited")
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such pipeline, watch, group, alert or channel")
REFUSED = OpenApiResponse(RefusalSerializer, description="Refused (wrong state, another action running, outside "
                                                         "the log); audited, nothing changed")
UNAVAILABLE = OpenApiResponse(ErrorSerializer, description="Kafka or the task broker did not answer; nothing "
                                                           "changed")
THROTTLED = OpenApiResponse(ErrorSerializer, description="Too many requests; try again later")
WRONG_METHOD = OpenApiResponse(ErrorSerializer, description="A method or body type this path does not take")
NOT_ACCEPTABLE = OpenApiResponse(ErrorSerializer, description="An Accept header that names no type this path "
                                                              "answers in")
REFUSALS = {400: BAD_INPUT, 401: FORBIDDEN, 403: FORBIDDEN, 404: NOT_FOUND, 405: WRONG_METHOD, 406: NOT_ACCEPTABLE,
            413: BAD_INPUT, 415: WRONG_METHOD, 429: THROTTLED}


def answers(ok, status: int = 200, extra: dict | None = None) -> dict:
    """An operation's OpenAPI responses: `ok` at `status`, the refusals every door may answer, and `extra`
    ({409: REFUSED, ...})."""
    return {status: ok, **REFUSALS, **(extra or {})}


def field_errors(errors) -> dict[str, list[dict]]:
    """DRF's errors as {"field": [{"message", "code"}]} (the shape Django forms give), nested list items
    flattened into their field ("partitions": "item 1: Must be a JSON integer.")."""
    def flatten(problems, prefix=""):
        if isinstance(problems, dict):
            return [item for key, value in problems.items() for item in flatten(value, f"{prefix}item {key}: ")]
        if isinstance(problems, list):
            return [item for value in problems for item in flatten(value, prefix)]
        return [{"message": prefix + str(problems), "code": getattr(problems, "code", "invalid")}]

    if not isinstance(errors, dict):
        errors = {"non_field_errors": errors}
    return {field: flatten(problems) for field, problems in errors.items()}


def refuse_invalid(request, serializer, action: str, pipeline=None, group_id: str = "") -> Response:
    """400 naming each bad field of the body; the refusal goes to the action log like every other."""
    return refuse_fields(request, serializer.errors, action, pipeline=pipeline, group_id=group_id)


def refuse_fields(request, errors, action: str, *, status: int = http.HTTP_400_BAD_REQUEST, **audit) -> Response:
    """400 (or `status`) naming each bad field, of a serializer's errors or of an operation's Invalid.problems:
    the one way every API door answers bad input, audited (`audit`: record_refusal's pipeline, group_id, params)."""
    errors = field_errors(errors)
    record_refusal(request.user, action, "bad input: " + "; ".join(
        f"{field}: {' '.join(e['message'] for e in problems)}" for field, problems in errors.items()), **audit)
    return Response({"errors": errors}, status=status)


class HasRole(BasePermission):
    """Viewers and operators only: a signed-in user (session or token) in neither role is refused, audited."""

    message = "Your account has no role: ask an administrator for the viewers or operators role."

    def has_permission(self, request, view):
        user = request.user
        if not (user and user.is_authenticated) or can_view(user):
            return True  # anonymous requests are IsAuthenticated's to refuse
        record_refusal(user, "view", "no role: " + self.message, params={"path": request.path,
                                                                         "method": request.method})
        return False


class OperatorForWrites(HasRole):
    viewer_message = ("Only operators may act (start, stop, pause, resume, restart, rewind, reset a group): "
                      "you have the viewer role.")

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False   # no role: HasRole's message says so
        if request.method in SAFE_METHODS or can_operate(request.user):
            return True
        self.message = self.viewer_message   # DRF answers with the refusing instance's message
        if request.user and request.user.is_authenticated:
            refuse(request, "viewer role: " + self.message)
        return False


def refuse(request, reason: str, kwargs: dict | None = None) -> None:
    """Audit an API refusal under the action the URL names (its `action`, else the action its success is
    logged under), with the pipeline or group it concerns."""
    from consumers.models import Pipeline

    if kwargs is None:
        kwargs = getattr(request, "parser_context", {}).get("kwargs", {}) or {}
    action = kwargs.get("action") or refused_action(request, "api")
    pipeline = Pipeline.objects.filter(name=kwargs["name"]).first() if kwargs.get("name") else None
    params = {"path": request.path}
    if kwargs.get("group_id"):   # a group is known by its cluster too: the refusal shows on that cluster's group
        params["cluster"] = request.GET.get("cluster") or clusters.DEFAULT
    record_refusal(request.user, action, reason, pipeline=pipeline, group_id=kwargs.get("group_id", ""),
                   params=params)
