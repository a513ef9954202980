"""Watches audited before 0015 kept their findings only on their ranges (WatchRange.lost_offsets,
duplicated_offsets, phantom_offsets: the first OFFSETS_LISTED of each kind). 0015 added WatchFinding, which the
trace and the findings CSV read, but left it empty: after an upgrade a record the old audit found lost was traced
as "delivered" and the CSV listed nothing. Copy the listed offsets of every range that has no WatchFinding rows
yet. Offsets a range counted beyond its list were never stored and cannot be recovered."""
from django.db import migrations

BATCH = 5000   # rows per bulk insert: a range lists at most 1,000 offsets of each kind


def findings_of(watch_range, WatchFinding):
    common = {"watch_id": watch_range.watch_id, "partition": watch_range.partition,
              "checked_at": watch_range.checked_at}
    for offset in watch_range.lost_offsets or []:
        yield WatchFinding(offset=offset, kind="lost", extra=0, **common)
    for offset, extra in watch_range.duplicated_offsets or []:   # [[offset, extra rows], ...]
        yield WatchFinding(offset=offset, kind="duplicated", extra=extra, **common)
    for offset in watch_range.phantom_offsets or []:
        yield WatchFinding(offset=offset, kind="phantom", extra=0, **common)


def copy_range_findings(apps, schema_editor):
    WatchRange = apps.get_model("consumers", "WatchRange")
    WatchFinding = apps.get_model("consumers", "WatchFinding")
    pending = []
    ranges = WatchRange.objects.exclude(lost=0, duplicated=0, phantom=0).order_by("id")
    for watch_range in ranges.iterator():
        # A range audited since 0015 has its rows already: never copy them twice.
        if WatchFinding.objects.filter(watch_id=watch_range.watch_id, partition=watch_range.partition,
                                       offset__gte=watch_range.start, offset__lt=watch_range.end).exists():
            continue
        pending.extend(findings_of(watch_range, WatchFinding))
        if len(pending) >= BATCH:
            WatchFinding.objects.bulk_create(pending)
            pending = []
    WatchFinding.objects.bulk_create(pending)


class Migration(migrations.Migration):
    dependencies = [
        ("consumers", "0018_ledger_committed_at_database_clock"),
    ]
    # Going back to before 0015 drops the table; to 0018 the copied rows may stay (they are true findings).
    operations = [migrations.RunPython(copy_range_findings, migrations.RunPython.noop)]
