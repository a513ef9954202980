"""Tests' and benches' arrangement: a pipeline row and its sink table, made directly, with any fields a test
needs (an epoch, a batch size) and without Kafka. The product creates pipelines through
consumers.operations.pipeline_setup only (validated, audited); this keeps only its sink-name rule, so that no
test writes into a table of an installed app."""
from django.db import connection, transaction

from consumers.engine import sink_names, sinks
from consumers.engine.transforms import resolve
from consumers.models import DeliveryMode, Pipeline


def create_pipeline(name: str, topic: str, sink_table: str, transform: str = "int_value",
                    delivery_mode: str = DeliveryMode.EXACTLY_ONCE, *, exist_ok: bool = False,
                    **fields) -> Pipeline:
    """Create a pipeline and its sink table (transform columns + provenance; a unique provenance key for
    exactly-once) in one transaction. `fields` are other Pipeline fields (group_id, batch_size,
    reset_policy, on_bad_record, engine, ...). With exist_ok, an existing pipeline of that name is
    returned unchanged (its sink table is created if missing)."""
    if delivery_mode not in DeliveryMode.values:
        raise ValueError(f"Unknown delivery mode {delivery_mode!r}: use one of {', '.join(DeliveryMode.values)}.")
    # The same rule on sink tables as every other door (sink_names): a plain name of the allowed schema that
    # belongs to no app, refused before anything is written.
    problem = sink_names.name_problem(sink_table) if sink_table else "required"
    if problem is None:
        with connection.cursor() as cursor:
            problem = sink_names.schema_problem(cursor, sink_table)
    if problem:
        raise ValueError(f"Sink table {sink_table!r}: {problem}.")
    resolved = resolve(transform)
    with transaction.atomic():
        existing = Pipeline.objects.select_for_update().filter(name=name).first()
        if existing is not None and not exist_ok:
            raise ValueError(f"A pipeline named {name!r} exists already.")
        pipeline = existing or Pipeline.objects.create(
            name=name, topic=topic, sink_table=sink_table, transform=transform, delivery_mode=delivery_mode,
            **fields)
        with connection.cursor() as cursor:
            sinks.ensure_sink_table(cursor, pipeline.sink_table, resolve(pipeline.transform) if existing else resolved,
                                    pipeline.is_exactly_once)
    return pipeline
