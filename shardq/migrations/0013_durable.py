"""Durable long jobs (issue 26): shardq_job_step (steps, cursors, sleeps and
waits a job recorded), shardq_job_signal (signals sent to jobs), the
SUSPENDED status and the waker's partial index over it. The claim index
(status = 'READY') is unchanged: SUSPENDED jobs are not in it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0012_key_limited"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobSignal",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.BigIntegerField()),
                ("name", models.TextField()),
                ("payload", models.JSONField(blank=True, null=True)),
                ("sent_at", models.DateTimeField()),
                ("consumed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "shardq_job_signal",
            },
        ),
        migrations.CreateModel(
            name="JobStep",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id", "name", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("name", models.TextField()),
                ("kind", models.CharField(max_length=10)),
                ("output", models.JSONField(blank=True, null=True)),
                ("fence", models.BigIntegerField()),
                ("batches", models.IntegerField(db_default=0, default=0)),
                ("total", models.BigIntegerField(blank=True, null=True)),
                ("done", models.BooleanField(db_default=False, default=False)),
                ("until", models.DateTimeField(blank=True, null=True)),
                ("recorded_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "durable step",
                "db_table": "shardq_job_step",
            },
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("READY", "Ready"),
                    ("RUNNING", "Running"),
                    ("FAILED", "Failed"),
                    ("SUCCESSFUL", "Successful"),
                    ("CLAIMED", "Claimed"),
                    ("WAITING", "Waiting"),
                    ("SUSPENDED", "Suspended"),
                ],
                default="READY",
                max_length=10,
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "SUSPENDED")),
                fields=["shard", "run_after"],
                name="shardq_job_suspended_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="jobsignal",
            index=models.Index(fields=["job_id", "name", "id"], name="shardq_job_signal_idx"),
        ),
    ]
