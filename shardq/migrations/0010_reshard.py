"""Online resharding: the cluster's versioned settings (``shardq_cluster``).

One row holding the shard count that enqueues and claims read in SQL
(``manage.py shardq_reshard`` changes it). The row is created here from
SHARDQ["SHARD_COUNT"], and again by ``ensure_shards`` (post_migrate) when a
flush removed it.
"""

from django.db import migrations, models


def create_row(apps, schema_editor):
    from shardq.conf import get_config

    Cluster = apps.get_model("shardq", "Cluster")
    Cluster.objects.using(schema_editor.connection.alias).get_or_create(
        id=1, defaults={"shard_count": get_config().shard_count, "version": 1}
    )


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0009_workflows"),
    ]

    operations = [
        migrations.CreateModel(
            name="Cluster",
            fields=[
                ("id", models.SmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("shard_count", models.IntegerField()),
                ("version", models.BigIntegerField(default=1)),
                ("reshard_from", models.IntegerField(blank=True, null=True)),
                ("switched_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "shardq_cluster",
                "constraints": [models.CheckConstraint(condition=models.Q(("id", 1)), name="shardq_cluster_one_row")],
            },
        ),
        migrations.RunPython(create_row, migrations.RunPython.noop),
    ]
