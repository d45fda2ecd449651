# Unique jobs (DESIGN §6): one row a unique key, taken by a job until expires_at.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0002_due_index"),
    ]

    operations = [
        # The table by hand: Django would add a second index on the text
        # primary key (text_pattern_ops, for LIKE) that every enqueue of a
        # unique task would pay for; the key is only ever looked up by equality.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    'CREATE TABLE "shardq_unique" ('
                    '"key" text COLLATE "C" NOT NULL PRIMARY KEY, '
                    '"job_id" bigint NOT NULL, '
                    '"expires_at" timestamp with time zone NOT NULL)',
                    reverse_sql='DROP TABLE "shardq_unique"',
                ),
            ],
            state_operations=[
                migrations.CreateModel(
                    name="UniqueKey",
                    fields=[
                        ("key", models.TextField(db_collation="C", primary_key=True, serialize=False)),
                        ("job_id", models.BigIntegerField()),
                        ("expires_at", models.DateTimeField()),
                    ],
                    options={
                        "db_table": "shardq_unique",
                    },
                ),
            ],
        ),
    ]
