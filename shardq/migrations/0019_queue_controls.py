from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0018_durable_ordered"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueControl",
            fields=[
                ("queue_name", models.TextField(primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False, default=False)),
                ("concurrency", models.IntegerField(blank=True, null=True)),
                ("updated_at", models.DateTimeField()),
                ("updated_by", models.TextField(blank=True, db_default="", default="")),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "db_table": "shardq_queue_control",
                "default_permissions": ("view", "change"),
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("concurrency__isnull", True), ("concurrency__gte", 1), _connector="OR"),
                        name="shardq_queue_control_concurrency_gte_1",
                    )
                ],
            },
        ),
    ]
