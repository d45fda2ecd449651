"""traceparent: the W3C trace context of the span that enqueued the job
(shardq[otel], docs/operations.md "OpenTelemetry"), so each attempt's span
is a child of the enqueuing trace. Nullable: NULL when tracing is off or
the enqueue had no valid span; adding it rewrites nothing."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0014_fairness"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="traceparent",
            field=models.TextField(blank=True, null=True),
        ),
    ]
