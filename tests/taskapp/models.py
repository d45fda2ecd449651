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
