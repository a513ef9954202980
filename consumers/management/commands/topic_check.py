"""`topic_check PIPELINE [--json]`

Runs the topic check of a pipeline in this process (no Celery) and stores it as a TopicCheckJob, like the
dashboard's. What is read comes from the pipeline's definition: its topic, group, sink table, and the key
column and value parser of its transform. Exits 0 when every record's key is in the table once; 1 when
keys are missing or duplicated (the report is printed first), when the topic check could not run, or when
the pipeline cannot be checked.
"""
import json

from django.core.management.base import CommandError

from consumers.access import record_refusal
from consumers.management.cli import TallyCommand, refused
from consumers.models import Pipeline, TopicCheckStatus


class Command(TallyCommand):
    help = "Check a pipeline's topic range (up to its committed offsets) against its sink table, with Spark."
    exit_codes = ("0 every key in the table once, 1 keys missing or duplicated, the check failed, or refused, "
                  "2 usage error")

    def add_arguments(self, parser):
        parser.add_argument("pipeline", help="The pipeline's name.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args, pipeline, **options):
        from consumers.reconciliation.topic_check import TopicCheckError, create_job, run_topic_check_job

        found = Pipeline.objects.filter(name=pipeline).first()
        if found is None:
            reason = f"No pipeline named {pipeline!r}."
            record_refusal("cli", "topic_check", reason, params={"via": "cli", "pipeline": pipeline})
            raise refused(reason)
        try:
            job = create_job(found, requested_by="cli")
        except TopicCheckError as exc:   # audited, as the page and the API audit it
            record_refusal("cli", "topic_check", str(exc), pipeline=found, params={"via": "cli"})
            raise refused(str(exc)) from None
        job = run_topic_check_job(job.pk)
        if job.status != TopicCheckStatus.DONE:
            raise CommandError(f"Topic check failed: {job.error}")
        report = job.result
        if options["json"]:
            self.stdout.write(json.dumps(report))
        else:
            self.stdout.write(self._text(report))
        if report["missing_count"] or report["duplicated_count"]:
            raise CommandError(f"Not exact: {report['missing_count']} missing, {report['duplicated_count']} "
                               f"duplicated key(s) (topic check job {job.pk})", returncode=1)

    @staticmethod
    def _text(report) -> str:
        lines = [f"{report['topic']} (group {report['group_id']}, offsets from {report['offsets_source']}) vs "
                 f"{report['table']}.{report['key_column']}: {report['records_read']} records, "
                 f"{report['rows_read']} rows, {report['seconds']} s",
                 f"  missing:    {report['missing_count']}  {_sample(report['missing'])}",
                 f"  duplicated: {report['duplicated_count']}  {_sample(report['duplicated'])}",
                 f"  unexpected: {report['unexpected_count']}  {_sample(report['unexpected'])}"]
        return "\n".join(lines)


def _sample(values, limit=20) -> str:
    items = [f"{k}x{v}" for k, v in values.items()] if isinstance(values, dict) else [str(v) for v in values]
    return ", ".join(items[:limit]) + (" ..." if len(items) > limit else "")
