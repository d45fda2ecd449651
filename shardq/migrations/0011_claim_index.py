"""One claim index for unlimited and limited jobs: shardq_job_ready_idx is
(shard, limit_keys IS NULL, priority DESC, run_after, id) WHERE READY, and
shardq_job_limited_idx goes. claim_jobs walks a shard's unlimited jobs, the
limited claim its limited ones, neither passing over the other's rows
(docs/limits.md, "Design")."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0010_reshard"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="shardq_job_ready_idx",
        ),
        migrations.RemoveIndex(
            model_name="job",
            name="shardq_job_limited_idx",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("shard"),
                models.ExpressionWrapper(models.Q(("limit_keys__isnull", True)), output_field=models.BooleanField()),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("status", "READY")),
                name="shardq_job_ready_idx",
            ),
        ),
    ]
