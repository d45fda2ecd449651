"""key_limited: a job under a limit partitioned by its own shard key
(max_concurrency with limit_by naming the key), enforced by the key's
owner in its local queue instead of the slot table (docs/limits.md,
"Limits by the shard key"). Added with a database default, so existing
rows read false with no rewrite of the table; the partial index holds only
such jobs while unfinished (empty in a project that uses none)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0011_claim_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="key_limited",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("key_limited", True), ("status__in", ["READY", "CLAIMED", "RUNNING"])),
                fields=["shard", "shard_key", "id"],
                name="shardq_job_key_limited_idx",
            ),
        ),
    ]
