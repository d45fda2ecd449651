from django.db import models

from shardq import RankedModel


class Order(RankedModel):
    """An order; its status moves forward only (``shardq.advance`` on its
    ``status_rank``), whichever of the workflow's jobs writes last."""

    # Each status's rank: a late message setting an earlier one changes nothing.
    RANKS = {"placed": 0, "charged": 1, "packed": 2, "shipped": 3, "closed": 4}

    customer_id = models.IntegerField()
    total_cents = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=20, default="placed")


class Receipt(models.Model):
    """Written by the ``send_receipt`` task, once per order."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    worker = models.CharField(max_length=64)
    sent_at = models.DateTimeField(auto_now_add=True)


class OrderAudit(models.Model):
    """Written by the ``backfill_audits`` durable task, one per order: the
    unique order proves each batch committed once, through any ``kill -9``."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    job_id = models.BigIntegerField()
    total_cents = models.IntegerField()
    audited_at = models.DateTimeField(auto_now_add=True)
