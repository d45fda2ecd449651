# An ordered key's suspended durable job holds back the key's later jobs
# (docs/durable.md, "Ordered keys"): the claim's probe for one.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0017_audit"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("ordered", True), ("status", "SUSPENDED")),
                fields=["shard", "shard_key"],
                name="shardq_job_ordered_susp_idx",
            ),
        ),
    ]
