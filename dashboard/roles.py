"""The two roles of the dashboard, as Django groups: viewers see everything, operators may also act.

Who may do what is decided in consumers/access.py (`can_view`, `can_operate`), for every door; this
module only creates the groups with their permissions.
"""
from django.contrib.auth.models import Group, Permission

VIEWERS = "viewers"
OPERATORS = "operators"

# Viewers read every model the dashboard shows; the "view_*" permissions also open the read-only admin.
VIEW_MODELS = ("pipeline", "partitionoffset", "batchledger", "deadletter", "deadletterreplay", "consumerrun",
               "actionlog", "partitionhealth", "pipelinehealth", "lagsnapshot", "topiccheckjob")


def setup_roles() -> dict[str, int]:
    """Create or update both groups with their permissions; idempotent. Returns permissions per group."""
    view = list(Permission.objects.filter(content_type__app_label="consumers",
                                          codename__in=[f"view_{model}" for model in VIEW_MODELS]))
    operate = Permission.objects.get(content_type__app_label="consumers", codename="operate_pipeline")
    viewers, _ = Group.objects.get_or_create(name=VIEWERS)
    viewers.permissions.set(view)
    operators, _ = Group.objects.get_or_create(name=OPERATORS)
    operators.permissions.set([*view, operate])
    return {VIEWERS: len(view), OPERATORS: len(view) + 1}
