"""The job history searched as the job list is (issue 27 §2): by shard key,
by an argument's value and by tag, each on an index of shardq_job_history.

Most of ten million jobs are in the history (0022_job_history), so a search
by ``customer_id=7``, ``customer-7`` or the tag ``billing`` that reads only
shardq_job misses nearly all of them, and without an index it reads every
partition. The three indexes are those of shardq_job (0024_tags_and_search):
a hash index of the shard key, a GIN (jsonb_path_ops) of the keyword
arguments, a partial GIN of the tags.

An index of a partitioned table cannot be built CONCURRENTLY, and a plain
build holds a SHARE lock on every partition for minutes at ten million rows
(the archiver's INSERT waits that long). So, as PostgreSQL's documentation
advises: each index is created ``ON ONLY`` the parent (invalid, nothing
built), then built CONCURRENTLY on each partition and attached; once every
partition's is attached the parent's is valid. The partitions the archiver
creates later get them at creation. The archiver pays for them at its
INSERT (off the claim path; docs/benchmarks.md, "The admin at ten million
jobs", has the measured cost).
"""

from django.db import migrations

# (name, method and columns, predicate): on shardq_job_history and each partition.
INDEXES = [
    ("shardq_job_history_key_idx", "USING hash (shard_key)", "WHERE shard_key IS NOT NULL"),
    ("shardq_job_history_kwargs_idx", "USING gin (kwargs jsonb_path_ops)", ""),
    ("shardq_job_history_tags_idx", "USING gin (tags jsonb_path_ops)", "WHERE tags IS NOT NULL"),
]


def partitions(cursor) -> list[str]:
    cursor.execute(
        "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'shardq_job_history'::regclass ORDER BY c.relname"
    )
    return [row[0] for row in cursor.fetchall()]


def forward(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        names = partitions(cursor)
        for name, how, where in INDEXES:
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON ONLY shardq_job_history {how} {where}")
            suffix = name.removeprefix("shardq_job_history_")
            for partition in names:
                index = f"{partition}_{suffix}"[:63]
                cursor.execute(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{partition}" {how} {where}')
                cursor.execute(
                    "SELECT 1 FROM pg_inherits WHERE inhrelid = %s::regclass AND inhparent = %s::regclass",
                    [f'"{index}"', name],
                )
                if not cursor.fetchone():
                    cursor.execute(f'ALTER INDEX {name} ATTACH PARTITION "{index}"')


def backward(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        for name, _how, _where in INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY runs outside a transaction.
    atomic = False
    dependencies = [
        ("shardq", "0025_dead_owner"),
    ]

    operations = [migrations.RunPython(forward, backward)]
