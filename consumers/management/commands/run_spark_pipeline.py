"""`run_spark_pipeline NAME`: `run_pipeline NAME --engine spark` under its own name."""
from consumers.management.commands.run_pipeline import Command as RunPipeline


class Command(RunPipeline):
    help = "Run a pipeline on Spark Structured Streaming in the foreground."
    engine_override = "spark"
