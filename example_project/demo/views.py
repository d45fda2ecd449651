import functools
import hmac
import json
import statistics
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpResponseBadRequest, HttpResponseForbidden, JsonResponse
from django.shortcuts import redirect, render
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import shardq
from shardq.metrics import metrics_view

from .models import Order
from .tasks import add, build_report, send_receipt


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


# Two tenants share the "default" queue (docs/fairness.md): the noisy one
# enqueues NOISY_REPORTS reports at once, the quiet one QUIET_REPORTS. With
# build_report's fair key the workers' threads take the tenants in turn, so
# the quiet tenant's reports run at once, not behind the noisy backlog.
QUIET, NOISY = "acme", "globex"
NOISY_REPORTS = 2000
QUIET_REPORTS = 20


def tenant_figures(tenant: str) -> dict:
    """A tenant's reports: waiting, finished in the last minute, and how
    long those started in the last minute waited once due (pickup)."""
    from shardq.models import Job

    jobs = Job.objects.filter(task_path=build_report.module_path, args__0=tenant)
    since = timezone.now() - timedelta(minutes=1)
    started = jobs.filter(started_at__gte=since).values_list("started_at", "run_after", "enqueued_at")
    pickups = sorted(max(0.0, (s - max(due, enqueued)).total_seconds()) for s, due, enqueued in started)
    return {
        "tenant": tenant,
        "waiting": jobs.filter(status__in=["READY", "CLAIMED"]).count(),
        "finished": jobs.filter(status="SUCCESSFUL", finished_at__gte=since).count(),
        "started": len(pickups),
        "pickup_p50_ms": round(1000 * statistics.median(pickups)) if pickups else None,
        "pickup_p99_ms": round(1000 * pickups[min(len(pickups) - 1, int(0.99 * len(pickups)))]) if pickups else None,
    }


@require_GET
def tenants(request):
    """The two tenants' reports, with a "noisy tenant" and a "quiet tenant" button."""
    figures = [tenant_figures(QUIET), tenant_figures(NOISY)]
    if request.GET.get("format") == "json":
        return JsonResponse({"tenants": figures})
    context = {"tenants": figures, "noisy_reports": NOISY_REPORTS, "quiet_reports": QUIET_REPORTS}
    return render(request, "demo/tenants.html", context)


@require_POST
def noisy_tenant(request):
    """The noisy tenant enqueues NOISY_REPORTS reports at once."""
    shardq.enqueue_many(build_report, [((NOISY, n), {}) for n in range(NOISY_REPORTS)])
    return redirect("tenants")


@require_POST
def quiet_tenant(request):
    """The quiet tenant's QUIET_REPORTS reports."""
    shardq.enqueue_many(build_report, [((QUIET, n), {}) for n in range(QUIET_REPORTS)])
    return redirect("tenants")
