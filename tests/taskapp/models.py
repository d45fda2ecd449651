from django.db import models


class Ledger(models.Model):
    """One row per committed execution of a ledger task."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    fence = models.BigIntegerField(default=0)
    worker = models.CharField(max_length=64)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["job_id"], name="taskapp_ledger_job_idx")]


class FaultLedger(models.Model):
    """Fault tests: one row per committed outcome, written in the same
    transaction as the job's fenced completion (shardq.complete_in_transaction).
    Two rows for one job would be a double commit: no unique constraint, so
    the invariants can see one instead of an IntegrityError hiding it."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    fence = models.BigIntegerField()
    # The shard's claim_version at COMMIT (locked by the completion until then).
    shard_version = models.BigIntegerField()
    worker = models.CharField(max_length=64)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["job_id"], name="taskapp_faultledger_job_idx")]


class Execution(models.Model):
    """Fault tests: one row per execution (not commit) of a fault task, written
    over a separate autocommit connection before the task does its work."""

    job_id = models.BigIntegerField()
    attempt = models.IntegerField()
    fence = models.BigIntegerField()
    worker = models.CharField(max_length=64)
    pid = models.IntegerField()
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["job_id"], name="taskapp_execution_job_idx")]


class Item(models.Model):
    """Durable tests: the rows a backfill iterates."""

    tenant = models.IntegerField()
    n = models.IntegerField()


class ItemLedger(models.Model):
    """Durable tests: one row per item a backfill's committed batch handled.
    No unique constraint: a duplicate must be seen, not hidden by an error."""

    item_id = models.BigIntegerField()
    job_id = models.BigIntegerField()
    fence = models.BigIntegerField()
    batch = models.IntegerField(default=0)
    pid = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["job_id"], name="taskapp_itemledger_job_idx")]


class StepRun(models.Model):
    """Durable tests: one row each time a step's function really ran."""

    job_id = models.BigIntegerField()
    name = models.CharField(max_length=100)


class BatchRun(models.Model):
    """Durable fault tests: one row each time a batch began (written over a
    connection of its own, outside the batch's transaction): a batch begun
    twice, first item and all, was run twice (its first run rolled back)."""

    job_id = models.BigIntegerField()
    first_item = models.BigIntegerField()
    pid = models.IntegerField()
