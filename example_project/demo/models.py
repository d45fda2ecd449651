from django.db import models


class Order(models.Model):
    customer_id = models.IntegerField()
    total_cents = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)


class Receipt(models.Model):
    """Written by the ``send_receipt`` task, once per order."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    worker = models.CharField(max_length=64)
    sent_at = models.DateTimeField(auto_now_add=True)
