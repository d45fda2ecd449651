# The operator's admin (DESIGN §7): the dead-letter actions' permissions and
# the dashboard's entry (a proxy model: no table, only a URL and a permission).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0003_unique_key"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": ("view",),
                "indexes": [],
                "constraints": [],
            },
            bases=("shardq.shard",),
        ),
        migrations.AlterModelOptions(
            name="job",
            options={
                "permissions": [
                    ("retry_job", "Can retry failed jobs (back to READY with fresh attempts)"),
                    ("discard_job", "Can discard (delete) failed jobs"),
                ]
            },
        ),
    ]
