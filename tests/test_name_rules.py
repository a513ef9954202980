"""Names end where they seem to: a trailing newline makes a name no rule takes. Python's `$` also matches before
a final newline, so `pipeline create $'orders\\n'` once stored a pipeline no URL could name, and every page that
links it (the action log among them) answered 500."""
import pytest

from consumers.engine.sink_names import name_problem
from consumers.kafka.clusters import Cluster
from consumers.kafka.errors import ClusterConfigError
from consumers.operations import pipeline_setup, watch_setup
from consumers.operations.pipeline_setup import PipelineSpec
from consumers.operations.watch_setup import WatchSpec

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("field, spec", [
    ("name", PipelineSpec("orders\n", "nums", "orders_sink")),
    ("topic", PipelineSpec("orders", "nums\n", "orders_sink")),
    ("sink_table", PipelineSpec("orders", "nums", "orders_sink\n")),
])
def test_a_pipeline_field_ending_in_a_newline_is_refused(field, spec):
    with pytest.raises(pipeline_setup.Invalid) as refused:
        pipeline_setup.validate(spec)
    assert field in refused.value.problems


def test_a_sink_table_name_ending_in_a_newline_is_not_a_plain_name():
    assert "use a plain table name" in name_problem("orders\n")
    assert name_problem("orders") is None


def test_a_watch_name_ending_in_a_newline_is_refused():
    spec = WatchSpec(name="billing\n", group="g", topic="t", sink_table="t", record_id="value", row_id="id")
    with pytest.raises(watch_setup.Invalid) as refused:
        watch_setup.validate(spec)
    assert "name" in refused.value.problems   # (it was: a watch's text fields must be printable)


def test_a_cluster_name_ending_in_a_newline_is_refused():
    with pytest.raises(ClusterConfigError, match="a cluster name is 1-64 letters"):
        Cluster(name="prod\n", bootstrap_servers="b:9092")


def test_the_models_cluster_name_validator_takes_no_trailing_newline_either():
    from django.core.exceptions import ValidationError

    from consumers.models.pipeline import validate_cluster_name

    validate_cluster_name("prod-eu.1")
    with pytest.raises(ValidationError):
        validate_cluster_name("prod\n")
