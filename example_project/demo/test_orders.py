"""The demo app's own tests, written as an application's are: Django's
TestCase (nothing commits), shardq.testing to run the jobs the code enqueued.
Run by `make test` (pytest) and by `python manage.py test example_project.demo`."""

from django.db import transaction
from django.test import TestCase

from shardq.testing import WORKER_ID, assert_enqueued, assert_not_enqueued, drain

from .models import Order, Receipt
from .tasks import add, close_order, order_workflow, send_receipt


class OrderTests(TestCase):
    def test_an_order_posted_enqueues_its_receipt_and_the_receipt_is_sent_once_drained(self):
        response = self.client.post(
            "/orders/", {"customer_id": 7, "total_cents": 1200}, content_type="application/json"
        )
        order_id, job_id = response.json()["order"], response.json()["job"]

        [job] = assert_enqueued(send_receipt, kwargs={"customer_id": 7, "order_id": order_id}, queue="emails")
        self.assertEqual(job.id, job_id)
        self.assertFalse(Receipt.objects.exists())

        report = drain()

        self.assertEqual([ran.status for ran in report], ["SUCCESSFUL"])
        self.assertEqual(Receipt.objects.get(order_id=order_id).worker, WORKER_ID)
        self.assertEqual(send_receipt.get_result(job_id).return_value, 1200)
        assert_not_enqueued(send_receipt)

    def test_a_bad_order_enqueues_nothing(self):
        response = self.client.post("/orders/", {"customer_id": "x"}, content_type="application/json")

        self.assertEqual(response.status_code, 400)
        assert_not_enqueued(send_receipt)

    def test_the_order_workflow_runs_every_step_and_closes_the_order(self):
        order = Order.objects.create(customer_id=3, total_cents=500)
        with transaction.atomic():
            results = order_workflow(order).enqueue()

        report = drain()

        self.assertEqual(report.failed, [])
        self.assertEqual(len(report), 5)
        order.refresh_from_db()
        self.assertEqual(order.status, "closed")
        closed = results[-1]
        closed.refresh()
        self.assertEqual(closed.task.module_path, close_order.module_path)
        self.assertEqual(closed.return_value, {"send_receipt": "SUCCESSFUL", "ship_order": "SUCCESSFUL"})

    def test_the_add_view_enqueues_on_the_reports_queue(self):
        response = self.client.post("/add/", {"a": 2, "b": 3}, content_type="application/json")

        assert_enqueued(add, args=[2, 3], queue="reports")
        drain(queue="reports")
        self.assertEqual(add.get_result(response.json()["job"]).return_value, 5)
