import functools
import hmac
import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpResponseBadRequest, HttpResponseForbidden, JsonResponse
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shardq.metrics import metrics_view

from .models import Order
from .tasks import add, send_receipt


@csrf_exempt
@require_POST
def create_order(request):
    """Create an order and, in the same transaction, enqueue its receipt."""
    try:
        body = json.loads(request.body or b"{}")
        customer_id, total = int(body["customer_id"]), int(body["total_cents"])
    except (ValueError, KeyError, TypeError):
        return HttpResponseBadRequest('POST JSON {"customer_id": int, "total_cents": int}')
    with transaction.atomic():
        order = Order.objects.create(customer_id=customer_id, total_cents=total)
        result = send_receipt.enqueue(customer_id=customer_id, order_id=order.pk)
    return JsonResponse({"order": order.pk, "job": result.id}, status=201)


@csrf_exempt
@require_POST
def enqueue_add(request):
    try:
        body = json.loads(request.body or b"{}")
        result = add.enqueue(body["a"], body["b"])
    except (ValueError, KeyError, TypeError, InvalidTask) as exc:
        return HttpResponseBadRequest(str(exc))
    return JsonResponse({"job": result.id}, status=201)


@login_required
@require_GET
def job_status(request, job_id):
    """A job's status, for its owner and staff only: arguments and results
    are private. The owner of a job is the customer its ``customer_id``
    argument names (a receipt's); a job of no customer is staff's to read.
    Anyone else gets the same 404 as for a job that does not exist, so ids
    cannot be probed."""
    try:
        result = send_receipt.get_backend().get_result(job_id)
    except TaskResultDoesNotExist:
        raise Http404("no such job") from None
    if not (request.user.is_staff or owner_of(result) == request.user.pk):
        raise Http404("no such job")
    body = {"id": result.id, "status": result.status, "worker_ids": result.worker_ids}
    if result.status == "SUCCESSFUL":
        body["return_value"] = result.return_value
    return JsonResponse(body)


def staff_or_token(view):
    """An access rule for a metrics view: a scraper sends
    ``Authorization: Bearer <METRICS_TOKEN>``; a staff user may look in a
    browser; anyone else gets 403. No token configured: staff only."""

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        token = settings.METRICS_TOKEN
        sent = request.headers.get("Authorization", "")
        if token and hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return view(request, *args, **kwargs)
        if request.user.is_authenticated and request.user.is_staff:
            return view(request, *args, **kwargs)
        return HttpResponseForbidden("metrics: send Authorization: Bearer <METRICS_TOKEN>, or log in as staff")

    return guarded


# shardq's metrics of this web process (its enqueues and cancels), behind the rule.
metrics = require_GET(staff_or_token(metrics_view))


def owner_of(result) -> int | None:
    """The user id that owns a job: its ``customer_id`` argument (None: no owner)."""
    customer = result.kwargs.get("customer_id") if isinstance(result.kwargs, dict) else None
    return customer if isinstance(customer, int) and not isinstance(customer, bool) else None
