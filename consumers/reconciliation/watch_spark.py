"""The delivery audit of a large range on Spark executors: the same matching as PostgreSQL's path.

Used by watch_audit for a check whose settled ranges hold at least WATCH_SPARK_THRESHOLD records.
  records  executors read the topic range (read_committed, as topic_check: Spark's `kafka` format or Tally's
           own source, with the cluster's options) and derive each record's id with the same Python function
           as PostgreSQL's path (record_ids.derive, in an Arrow batch mapper): no second definition of ids;
  team     executors read the team's table by key ranges over JDBC (the row-id column when it holds integers,
           the offset column for offset ids), only the row-id columns;
  match    the statements of watch_match.py, the very same SQL text, run by Spark SQL over temporary views
           standing for PostgreSQL's relations (its "quoted" identifiers given to Spark in `backquotes`);
  findings streamed back to the check's PostgreSQL transaction (the temporary `found` table), where the
           rest of the audit (WatchFinding rows, counts, listed offsets) is shared with PostgreSQL's path.
"""
import io
import logging
import re
import uuid

from psycopg2 import sql

from consumers.engine import record_ids, table_names
from consumers.reconciliation import watch_match, watch_settled

log = logging.getLogger("tally.watch.spark")

# Rows per COPY chunk of findings sent from Spark to the check's transaction.
FOUND_CHUNK = 50_000
RECORD_FIELDS = (("partition", "int"), ("offset", "bigint"), ("rid", "string"), ("expected", "boolean"),
                 ("tomb", "boolean"), ("ts", "bigint"), ("tail", "boolean"), ("k", "string"))
TEAM_COLUMNS = ("c0", "c1")
QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def view_names() -> dict[str, str]:
    """This audit's temporary views, named apart from any other audit's in the same Spark session."""
    token = uuid.uuid4().hex[:12]
    return {name: f"tally_watch_{name}_{token}" for name in ("records", "written", "ranges", "team", "settled")}


def record_mapper(record_id: str, ignore: list[str], id_type: str | None, ends: dict[int, int], keyed: bool = False):
    """The executors' function: Arrow batches of Kafka rows -> rows of the relation `records` (see
    watch_match), each id derived by record_ids.derive as on PostgreSQL's path. Plain values only in the
    closure: it is pickled to Spark's Python workers, which have no Django."""

    def derive_batches(batches):
        import pyarrow as pa

        by_offset = id_type is None
        spec = None if by_offset else record_ids.parse_spec(record_id)
        ignores = [record_ids.parse_ignore(text) for text in ignore]
        normalise = record_ids.normaliser(id_type)
        keys = record_ids.names_by_key(spec, keyed)
        for batch in batches:
            columns = batch.to_pydict()
            rids, expected = [], []
            for key, value in zip(columns["key"], columns["value"], strict=True):
                rid, ignored = record_ids.derive(spec, ignores, normalise, key, value)
                rids.append(rid)
                expected.append(not ignored)
            yield pa.RecordBatch.from_arrays([
                pa.array(columns["partition"], pa.int32()), pa.array(columns["offset"], pa.int64()),
                pa.array(rids, pa.string()), pa.array(expected, pa.bool_()),
                pa.array([v is None for v in columns["value"]], pa.bool_()), pa.array(columns["ts"], pa.int64()),
                pa.array([o >= ends[p] for p, o in zip(columns["partition"], columns["offset"], strict=True)],
                         pa.bool_()),
                pa.array([record_ids.key_text(k) if keys else None for k in columns["key"]], pa.string()),
            ], names=[name for name, _ in RECORD_FIELDS])

    return derive_batches


def spark_sql(statement: sql.Composable, cur) -> str:
    """A statement of watch_match as Spark SQL reads it: the same text, its "quoted" identifiers in Spark's
    `backquotes`. Only identifiers are double-quoted there (string literals are 'single'), and every name in
    it is this module's (views and c0, c1), never one from a request."""
    return QUOTED.sub(lambda m: "`" + m.group(1).replace('""', '"').replace("`", "``") + "`", statement.as_string(cur))


def read_records(spark, watch, reads: dict[int, tuple[int, int]], marks: dict, id_type: str | None,
                 ends: dict[int, int]):
    """The relation `records` of the ranges `reads` ({partition: (first, end)}), derived on the executors."""
    from pyspark.sql import functions as F

    from consumers.engine.spark_source import cluster_options, kafka_format, offsets_json
    from consumers.kafka import clusters

    cluster = clusters.get(watch.cluster)
    fmt = kafka_format(spark, cluster)
    # Every partition of the topic is named: one left out would be read from its start to its end. Those
    # without a range to settle get an empty one.
    idle = {p: (mark.high, mark.high) for p, mark in marks.items() if p not in reads}
    ranges = {**idle, **reads}
    reader = (spark.read.format(fmt).options(**cluster_options(cluster)).option("subscribe", watch.topic)
              .option("startingOffsets", offsets_json(watch.topic, {p: first for p, (first, _) in ranges.items()}))
              .option("endingOffsets", offsets_json(watch.topic, {p: end for p, (_, end) in ranges.items()})))
    kafka = reader.load().select("key", "value", "partition", "offset", F.unix_millis("timestamp").alias("ts"))
    schema = ", ".join(f"{name} {kind}" for name, kind in RECORD_FIELDS)
    return kafka.mapInArrow(record_mapper(watch.record_id, list(watch.ignore), id_type, ends, watch.keyed), schema)


def read_team(spark, cur, table: str, columns: list[str], by_offset: bool):
    """The team's row-id columns (as c0[, c1]), read by the executors in ranges of an integer column. `table`:
    the watch's `table` or `schema.table` (consumers/engine/table_names.py)."""
    from consumers.reconciliation.topic_check import jdbc_options

    names = [sql.Identifier(c) for c in columns]
    aliased = [sql.SQL("{} AS {}").format(name, sql.Identifier(TEAM_COLUMNS[i])) for i, name in enumerate(names)]
    team = table_names.identifier(table)
    select = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(aliased), team).as_string(cur)
    ranged = names[1] if by_offset else names[0]
    cur.execute(sql.SQL("SELECT min({}), max({}) FROM {}").format(ranged, ranged, team))
    low, high = cur.fetchone()
    reader = spark.read.format("jdbc").options(**jdbc_options())
    if not (isinstance(low, int) and isinstance(high, int)):
        return reader.option("query", select).load()
    partitions = min(max(2, spark.sparkContext.defaultParallelism), high - low + 1)
    # Spark's bounds only set the stride: the first and last ranges are open-ended, no row is left out (and the
    # upper bound is the highest value itself: one past it overflows a long at bigint's largest).
    return (reader.option("dbtable", f"({select}) AS team")
            .option("partitionColumn", TEAM_COLUMNS[1 if by_offset else 0])
            .option("lowerBound", str(low)).option("upperBound", str(high))
            .option("numPartitions", str(partitions)).load())


def match(watch, cur, plans: dict, marks: dict, id_type: str | None, found_relation, *, phantoms: bool = True,
          tails: dict | None = None, settled: dict | None = None, notes: list | None = None) -> tuple[dict, dict]:
    """Run the audit of `plans` on Spark; every finding is COPYed into `found_relation` (partition, "offset",
    kind, extra) through `cur`. Returns ({partition: {records, ignored, unreadable}}, {partition: superseded}).
    `phantoms`: as watch_match.findings_sql; `tails`: keyed, partitions read from that offset as tail only
    (watch_commits.keyed_tails); `settled`: keyed, the positions earlier checks settled (watch_settled), of which
    the records of the ids judged now are read back as tail too; `notes`: the check's notes."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    by_offset = id_type is None
    columns = list(TEAM_COLUMNS[: len(watch.row_columns)])
    tails = tails or {}
    ends = {p: end for p, (_, _, end) in plans.items()} | tails
    # Keyed watches also read the unsettled tail (to the last stable offset: read_committed stops there), of
    # every partition.
    reads = {p: (first, max(end, marks[p].end) if watch.keyed else end) for p, (_, first, end) in plans.items()}
    reads |= {p: (first, max(first, marks[p].end)) for p, first in tails.items()}
    from consumers.engine.spark_session import get_spark

    spark = get_spark()
    names = view_names()
    views = {name: sql.Identifier(view) for name, view in names.items()}
    team = read_team(spark, cur, watch.sink_table, watch.row_columns, by_offset)
    records = read_records(spark, watch, reads, marks, id_type, ends)
    if not by_offset:  # the id in the row-id column's type, as PostgreSQL's temporary table holds it
        records = records.withColumn("rid", F.col("rid").try_cast(team.schema[TEAM_COLUMNS[0]].dataType))
    records = records.persist(StorageLevel.MEMORY_AND_DISK)   # read once: the counts and the match reuse it
    written = named = read_back = None
    try:
        records.createOrReplaceTempView(names["records"])
        if settled and not by_offset:
            read_back = _read_back_settled(spark, cur, watch, records, marks, id_type, team, settled, names,
                                           notes if notes is not None else [])
            if read_back is not None:
                read_back.createOrReplaceTempView(names["records"])
        ranked = records if read_back is None else read_back
        if not by_offset and record_ids.names_by_key(record_ids.parse_spec(watch.record_id), watch.keyed):
            named = _name_tombstones(spark, cur, ranked, views).persist(StorageLevel.MEMORY_AND_DISK)
            named.createOrReplaceTempView(names["records"])
        team.createOrReplaceTempView(names["team"])
        spark.createDataFrame([(p, first, end) for p, (_, first, end) in plans.items()],
                              "partition int, start bigint, `end` bigint").createOrReplaceTempView(names["ranges"])
        if watch_match.needs_written(by_offset, watch.keyed):
            written = spark.sql(spark_sql(watch_match.written_sql(names["team"], columns, by_offset, views), cur))
            written = written.persist()
            written.createOrReplaceTempView(names["written"])
        counts = _counts(ranked if named is None else named, by_offset)
        findings = spark.sql(spark_sql(watch_match.findings_sql(names["team"], columns, by_offset, watch.keyed,
                                                                views, phantoms=phantoms), cur))
        _copy_found(cur, found_relation, findings)
        superseded = {}
        if watch.keyed:
            superseded = {r[0]: r[1] for r in spark.sql(spark_sql(watch_match.superseded_sql(views), cur)).collect()}
    finally:
        for view in names.values():
            spark.catalog.dropTempView(view)
        records.unpersist()
        if read_back is not None:
            read_back.unpersist()
        if named is not None:
            named.unpersist()
        if written is not None:
            written.unpersist()
    return counts, superseded


def _read_back_settled(spark, cur, watch, records, marks: dict, id_type: str, team, settled: dict, names: dict,
                       notes: list):
    """`records` (registered under names["records"]) with the records of the ids and keys judged now read back
    from the positions earlier checks settled (watch_settled, watch_match.SETTLED_BEFORE), as tail, persisted: as
    PostgreSQL's path adds them to its table (None: nothing to read back). Spark plans the filter over the whole
    read-back range at once, spilling as it needs."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    views = {name: sql.Identifier(view) for name, view in names.items()}
    oldest = spark.sql(spark_sql(watch_match.oldest_judged_sql(views), cur)).collect()[0][0]
    spans = watch_settled.windows(watch, settled, oldest, notes)
    if not spans:
        return None
    back = read_records(spark, watch, spans, marks, id_type, dict.fromkeys(spans, 0))   # all tail: offsets >= 0
    back = back.withColumn("rid", F.col("rid").try_cast(team.schema[TEAM_COLUMNS[0]].dataType))
    back.createOrReplaceTempView(names["settled"])
    kept = spark.sql(spark_sql(watch_match.settled_before_sql(views), cur))
    return records.unionByName(kept).persist(StorageLevel.MEMORY_AND_DISK)


def _name_tombstones(spark, cur, records, views: dict):
    """The relation `records` with each tombstone's id taken from its key (watch_match.TOMBSTONE_IDS), as PostgreSQL's
    path updates its temporary table."""
    from pyspark.sql import functions as F

    ids = spark.sql(spark_sql(watch_match.tombstone_ids_sql(views), cur)).withColumnRenamed("rid", "named")
    return (records.join(ids, ["partition", "offset"], "left")
            .withColumn("rid", F.coalesce(F.col("rid"), F.col("named"))).select(*[n for n, _ in RECORD_FIELDS]))


def _counts(records, by_offset: bool) -> dict:
    from pyspark.sql import functions as F

    settled = records.where(~F.col("tail"))
    unreadable = F.lit(0) if by_offset else F.when(F.col("expected") & F.col("rid").isNull(), 1).otherwise(0)
    rows = settled.groupBy("partition").agg(
        F.count(F.lit(1)).alias("records"), F.sum(F.when(~F.col("expected"), 1).otherwise(0)).alias("ignored"),
        F.sum(unreadable).alias("unreadable")).collect()
    return {r["partition"]: {"records": int(r["records"]), "ignored": int(r["ignored"] or 0),
                             "unreadable": int(r["unreadable"] or 0)} for r in rows}


def _copy_found(cur, found_relation, findings) -> None:
    """Stream the findings from the executors into the check's transaction, a chunk at a time."""
    statement = sql.SQL('COPY {} (partition, "offset", kind, extra) FROM STDIN').format(found_relation)
    buffer, lines = io.StringIO(), 0
    for row in findings.toLocalIterator():
        buffer.write(f"{row[0]}\t{row[1]}\t{row[2]}\t{row[3]}\n")
        lines += 1
        if lines % FOUND_CHUNK == 0:
            buffer.seek(0)
            cur.copy_expert(statement.as_string(cur), buffer)
            buffer = io.StringIO()
    buffer.seek(0)
    cur.copy_expert(statement.as_string(cur), buffer)
    log.info("watch audit on Spark: %s findings", lines)
