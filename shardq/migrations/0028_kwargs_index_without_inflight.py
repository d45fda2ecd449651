"""The search index by keyword argument without the in-flight versions
(docs/benchmarks.md, "Search index cost"): every update of a job is a new
version in every index whose predicate it matches (none of them is HOT:
status is in partial-index predicates), so shardq_job_kwargs_idx took four
entries a job (enqueue, claim, start, outcome). Leaving out CLAIMED and
RUNNING makes it two; the search reads the jobs in flight through
shardq_job_inflight_idx (shardq/search.py, argument_filter).

The new index is built CONCURRENTLY under another name beside the old one,
the old one dropped CONCURRENTLY, then the new one takes its name: the
search has an index at every step, and no enqueue or claim waits on a
build."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

import shardq.models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("shardq", "0027_admin_hot_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=shardq.models.GinIndex(
                condition=models.Q(("status__in", ("CLAIMED", "RUNNING")), _negated=True),
                fields=["kwargs"],
                name="shardq_job_kwargs_new_idx",
                opclasses=["jsonb_path_ops"],
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="shardq_job_kwargs_idx"),
        migrations.RenameIndex(
            model_name="job", new_name="shardq_job_kwargs_idx", old_name="shardq_job_kwargs_new_idx"
        ),
    ]
