"""Alert channels in the JSON API: list and detail for everyone signed in (masked: no secret is ever
answered), add, delete and test for operators (viewers get 403, audited). Strict JSON input."""
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework import status as http
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from alerts import channel_actions
from alerts.api_schemas import ChannelAnswerSerializer, ChannelListSerializer, ChannelTestSerializer
from alerts.channels import KINDS
from alerts.models import Channel
from consumers.api_base import (
    BAD_INPUT,
    OperatorForWrites,
    StrictBooleanField,
    StrictSerializer,
    StrictStringField,
    answers,
    refuse_fields,
)

OPERATE = [IsAuthenticated, OperatorForWrites]


class ChannelInput(StrictSerializer):
    name = StrictStringField(max_length=100)
    kind = serializers.ChoiceField(choices=list(KINDS))
    url = StrictStringField(max_length=2000, required=False, default="", allow_blank=True)
    to = StrictStringField(max_length=2000, required=False, default="", allow_blank=True)
    routing_key = StrictStringField(max_length=200, required=False, default="", allow_blank=True)
    secret = StrictStringField(max_length=200, required=False, default="", allow_blank=True)
    rules = serializers.ListField(child=StrictStringField(max_length=100), required=False, default=list,
                                  max_length=1000)
    enabled = StrictBooleanField(required=False, default=True)


def _refused(request, problems: dict, status=http.HTTP_400_BAD_REQUEST) -> Response:
    return refuse_fields(request, problems, "alert_channel_add", status=status)


@extend_schema(methods=["GET"], operation_id="alert_channels_list", responses=answers(ChannelListSerializer))
@extend_schema(methods=["POST"], operation_id="alert_channels_create", request=ChannelInput,
               responses=answers(ChannelAnswerSerializer, status=201, extra={409: BAD_INPUT}))
@api_view(["GET", "POST"])
@permission_classes(OPERATE)
def channel_list(request):
    if request.method == "GET":
        return Response({"channels": [c.as_json() for c in Channel.objects.prefetch_related("rules")]})
    data = ChannelInput(data=request.data)
    if not data.is_valid():
        return _refused(request, data.errors)
    fields = data.validated_data
    if Channel.objects.filter(name=fields["name"]).exists():
        return _refused(request, {"name": "An alert channel with this name exists already."}, http.HTTP_409_CONFLICT)
    channel = Channel(name=fields["name"], kind=fields["kind"], url=fields["url"], recipients=fields["to"],
                      routing_key=fields["routing_key"], secret=fields["secret"], enabled=fields["enabled"])
    try:
        rules = channel_actions.rules_named(fields["rules"]) if fields["rules"] else []
        channel_actions.save(channel, request.user.get_username(), rules)
    except channel_actions.ChannelInvalid as exc:
        return _refused(request, exc.problems)
    return Response({"channel": channel.as_json()}, status=http.HTTP_201_CREATED)


@extend_schema(methods=["GET"], operation_id="alert_channels_detail", responses=answers(ChannelAnswerSerializer))
@extend_schema(methods=["DELETE"], operation_id="alert_channels_delete", responses=answers(None, status=204))
@api_view(["GET", "DELETE"])
@permission_classes(OPERATE)
def channel_detail(request, name):
    channel = get_object_or_404(Channel.objects.prefetch_related("rules"), name=name)
    if request.method == "DELETE":
        channel_actions.delete(channel, request.user.get_username())
        return Response(status=http.HTTP_204_NO_CONTENT)
    return Response({"channel": channel.as_json()})


@extend_schema(operation_id="alert_channel_test", request=None,
               responses=answers(ChannelTestSerializer, extra={502: ChannelTestSerializer}))
@api_view(["POST"])
@permission_classes(OPERATE)
def channel_test(request, name):
    """Sends a test message now; 200 with the receiver's answer, 502 when it did not answer with 2xx."""
    channel = get_object_or_404(Channel, name=name)
    ok, answer = channel_actions.test(channel, request.user.get_username())
    if not ok:
        return Response({"ok": False, "answer": answer, "error": f"The receiver did not accept the test: {answer}"},
                        status=http.HTTP_502_BAD_GATEWAY)
    return Response({"ok": True, "answer": answer})
