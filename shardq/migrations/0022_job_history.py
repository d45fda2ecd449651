"""History leaves the hot table (issue 27 §1, docs/architecture.md "History").

``shardq_job_history`` holds finished jobs moved out of ``shardq_job`` by the
archiver (shardq/worker/archiver.py): every column of ``shardq_job``, in the
same order (``CREATE TABLE ... (LIKE shardq_job)``: the archiver's
``INSERT ... SELECT *`` is positional, and ``tests/integration/test_history.py``
checks that the two tables' columns match), declaratively partitioned by
``finished_at`` (RANGE; the archiver creates the partitions ahead and drops
whole ones past the retention, no bulk DELETE). No primary key: a
partitioned table's unique index would have to hold ``finished_at``; a job's
id is unique because it leaves ``shardq_job`` in the statement that writes
it here. Indexes: the id (get_result, the admin's page), the admin's filters
by task, queue and status (each with the id: the list's order), and a BRIN
of ``finished_at`` (the dashboard's last minutes; rows arrive in that order).

On ``shardq_job``: ``shardq_job_archivable_idx``, the archiver's walk (the
finished jobs that move, oldest first). Its predicate is the block
``archivable`` of shardq/db/sql/job_history.sql, word for word: the planner
uses a partial index only for a query that repeats its predicate. Dead
letters are not in it: they stay in the hot table as the operator's work
items (retry, discard; shardq_prune --failed).

A column a later migration adds to ``shardq_job`` must be added to
``shardq_job_history`` in the same migration, at the same place (the
post-migrate hook ``shardq.db.store.sync_history_columns`` adds any that is
missing, at the end, so a migration that forgets still leaves the two
tables matching when both append).
"""

from django.db import migrations, models

FORWARD = """
CREATE TABLE shardq_job_history (LIKE shardq_job) PARTITION BY RANGE (finished_at);
CREATE INDEX shardq_job_history_id_idx ON shardq_job_history (id);
CREATE INDEX shardq_job_history_task_idx ON shardq_job_history (task_path, id);
CREATE INDEX shardq_job_history_queue_idx ON shardq_job_history (queue_name, id);
CREATE INDEX shardq_job_history_status_idx ON shardq_job_history (status, id);
CREATE INDEX shardq_job_history_finished_idx ON shardq_job_history USING brin (finished_at);
CREATE INDEX shardq_job_archivable_idx ON shardq_job (finished_at)
    WHERE status = 'SUCCESSFUL'
       OR (status = 'FAILED' AND errors -> -1 ->> 'exception_class_path' = 'shardq.exceptions.Cancelled');
"""

BACKWARD = """
INSERT INTO shardq_job SELECT * FROM shardq_job_history;
DROP TABLE shardq_job_history;
DROP INDEX shardq_job_archivable_idx;
"""


def history_fields():
    """JobHistory's fields as the migration state knows them: the model is
    unmanaged (the table is this migration's SQL), so only its name and
    table matter to Django's state."""
    return [("id", models.BigIntegerField(primary_key=True, serialize=False))]


class Migration(migrations.Migration):
    dependencies = [
        ("shardq", "0021_fair_round"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
        migrations.CreateModel(
            name="JobHistory",
            fields=history_fields(),
            options={
                "verbose_name": "job history",
                "verbose_name_plural": "job history",
                "db_table": "shardq_job_history",
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
