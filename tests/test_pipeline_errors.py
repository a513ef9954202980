"""Pipeline.last_error has one writer API: each kind writes its own prefix, cut and made storable, and a kind
clears only its own error."""
import pytest

from consumers.models import Pipeline, PipelineError
from consumers.pg_text import ERROR_TEXT_MAX

pytestmark = pytest.mark.django_db


@pytest.fixture
def pipeline():
    return Pipeline.objects.create(name="orders", topic="orders", group_id="orders", sink_table="sink_orders")


def stored(pipeline) -> str:
    return Pipeline.objects.get(pk=pipeline.pk).last_error


def test_each_kind_writes_its_prefix_with_an_optional_qualifier(pipeline):
    mine = Pipeline.objects.filter(pk=pipeline.pk)
    mine.set_error(PipelineError.HALTED, "offset 7: not a number", "bad_record")
    assert stored(pipeline) == "halted (bad_record): offset 7: not a number"
    mine.set_error(PipelineError.RUN_FAILED, "Kafka cluster 'default': unreachable", desired_state="stopped")
    assert stored(pipeline) == "run failed: Kafka cluster 'default': unreachable"
    assert Pipeline.objects.get(pk=pipeline.pk).desired_state == "stopped"   # other fields in the same UPDATE


def test_a_kind_clears_its_own_error_and_leaves_another_writers(pipeline):
    mine = Pipeline.objects.filter(pk=pipeline.pk)
    mine.set_error(PipelineError.RUN_FAILED, "boom")
    assert mine.clear_error(PipelineError.SINK) == 0 and stored(pipeline) == "run failed: boom"
    mine.set_error(PipelineError.SINK, "sink table 'sink_orders' does not exist")
    assert mine.clear_error(PipelineError.SINK) == 1 and stored(pipeline) == ""


def test_an_error_is_cut_and_made_storable(pipeline):
    Pipeline.objects.filter(pk=pipeline.pk).set_error(PipelineError.RUN_FAILED, "a\x00b\ud800" + "x" * 5000)
    text = stored(pipeline)
    assert len(text) == ERROR_TEXT_MAX and text.startswith("run failed: a\\x00b\\ud800x")
