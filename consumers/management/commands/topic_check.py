"""`topic_check --topic T --group G --table TABLE --key-column C [--value-parser NAME] [--json]`

Runs the topic check in this process (no Celery) and stores it as an TopicCheckJob, like the dashboard's.
Exits 0 when every record's key is in the table once; 1 when keys are missing or duplicated (the report
is printed first) or when the topic check could not run.
"""
import json

from django.core.management.base import BaseCommand, CommandError

from consumers.models import TopicCheckJob, TopicCheckStatus


class Command(BaseCommand):
    help = "Check a topic range (up to a group's committed offsets) against a table's keys, with Spark."

    def add_arguments(self, parser):
        from consumers.reconciliation.topic_check import VALUE_PARSERS

        parser.add_argument("--topic", required=True)
        parser.add_argument("--group", required=True, help="The consumer group whose committed offsets end the range.")
        parser.add_argument("--table", required=True)
        parser.add_argument("--key-column", required=True)
        parser.add_argument("--value-parser", default="int_value", choices=sorted(VALUE_PARSERS),
                            help="How a record maps to its key (default: int_value).")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")

    def handle(self, *args, topic, group, table, key_column, value_parser, **options):
        from consumers.reconciliation.topic_check import find_pipeline, run_topic_check_job

        job = TopicCheckJob.objects.create(topic=topic, group_id=group, table=table, key_column=key_column,
                                      value_parser=value_parser, requested_by="cli",
                                      pipeline=find_pipeline(topic, group))
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
