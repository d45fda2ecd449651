"""The admin at ten million jobs (issue 27 §2, docs/admin.md): two partial
indexes of shardq_job, which a job that succeeds never enters.
``shardq_job_failed_idx`` (finished_at of the FAILED jobs): the dashboard's
window of finished jobs read the table's every dead letter (seconds with
200,000 of them).
``shardq_job_dead_shard_idx``: the dashboard's dead letters per shard,
counted from the index (the dead-letter index by id sent each to the heap:
17 s for 200,000 at load 27); only dead letters are in it.
Built CONCURRENTLY: a plain build would block every enqueue and claim while
it runs."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("shardq", "0026_history_search"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "FAILED")), fields=["finished_at"], name="shardq_job_failed_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("attempts__gte", models.F("max_attempts")), ("status", "FAILED")),
                fields=["shard"],
                name="shardq_job_dead_shard_idx",
            ),
        ),
    ]
