"""The job list's bulk actions on everything matching its filter (docs/admin.md,
"Bulk actions"): a "… all matching" button per action the user may take, a
confirmation page with the filter and the count, then a progress page while
the action runs in batches on a thread of the web process (shardq/bulk.py).
Each operation is recorded in the admin's history (LogEntry) with its filter
and count when it ends."""

from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.views.main import IGNORED_PARAMS, ORDER_VAR, PAGE_VAR
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from .. import bulk

#: The confirmation page counts at most this many jobs ("at least N" beyond).
COUNT_CAP = 1_000_000


def filter_params(request) -> dict[str, str]:
    """The list's filter and search from its query string, without paging,
    ordering or the admin's own parameters."""
    skip = {PAGE_VAR, ORDER_VAR, *IGNORED_PARAMS}
    return {key: value for key, value in request.GET.items() if key not in skip}


def filter_text(params: dict[str, str]) -> str:
    return urlencode(sorted(params.items())) or "every job"


class BulkActionsMixin:
    """For JobAdmin: URLs, buttons and views of the bulk actions."""

    def bulk_urls(self):
        view = self.admin_site.admin_view  # type: ignore[attr-defined]
        return [
            path("bulk/<str:action>/", view(self.bulk_view), name="shardq_job_bulk"),
            path("bulk-progress/<int:operation_id>/", view(self.bulk_progress_view), name="shardq_job_bulk_progress"),
        ]

    def bulk_actions_for(self, request) -> list[bulk.BulkAction]:
        return [a for a in bulk.ACTIONS.values() if request.user.has_perm(f"shardq.{a.permission}")]

    def bulk_buttons(self, request) -> list[dict[str, str]]:
        params = filter_params(request)
        query = ("?" + urlencode(params)) if params else ""
        return [
            {
                "name": a.name,
                "title": f"{a.title} all matching",
                "url": reverse("admin:shardq_job_bulk", args=[a.name]) + query,
            }
            for a in self.bulk_actions_for(request)
        ]

    def _bulk_action(self, request, name: str) -> bulk.BulkAction:
        action = bulk.ACTIONS.get(name)
        if action is None:
            raise Http404(f"No bulk action {name!r}: one of {', '.join(bulk.ACTIONS)}.")
        if not (self.has_view_permission(request) and request.user.has_perm(f"shardq.{action.permission}")):  # type: ignore[attr-defined]
            raise PermissionDenied
        return action

    def bulk_view(self, request, action):
        """GET: what would be done (the filter, the count); POST: start it
        and go to its progress page. The filter is the query string, read by
        the job list's own ChangeList, so it matches exactly what the list shows."""
        action = self._bulk_action(request, action)
        changelist = self.get_changelist_instance(request)  # type: ignore[attr-defined]
        queryset = changelist.queryset
        params = filter_params(request)
        text = filter_text(params)
        if request.method == "POST":
            total = bulk.count_matching(action, queryset, cap=COUNT_CAP)
            operation = bulk.start(action, text, total, f"admin:{request.user.get_username()}")
            user_id = request.user.pk

            def record(result, error):
                row = bulk.get(operation) or {"done": "?"}
                outcome = (
                    f"failed after {row['done']} jobs: {error}"
                    if error
                    else f"{result.done} jobs {action.verb}, {result.skipped} skipped (changed meanwhile)"
                )
                LogEntry.objects.create(
                    user_id=user_id,
                    content_type_id=ContentType.objects.get_for_model(self.model).pk,  # type: ignore[attr-defined]
                    object_id=None,
                    object_repr=f"bulk {action.name} #{operation}",
                    action_flag=CHANGE,
                    change_message=f"Bulk {action.title.lower()} from the admin, filter {text}: {outcome}.",
                )

            bulk.run_in_background(action, queryset, operation, done=record)
            return HttpResponseRedirect(reverse("admin:shardq_job_bulk_progress", args=[operation]))
        total = bulk.count_matching(action, queryset, cap=COUNT_CAP)
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": f"{action.title} every matching job",
            "opts": self.opts,  # type: ignore[attr-defined]
            "action": action,
            "filter_text": text,
            "total": total,
            "capped": total >= COUNT_CAP,
            "back_url": reverse("admin:shardq_job_changelist") + (("?" + urlencode(params)) if params else ""),
        }
        return TemplateResponse(request, "admin/shardq/bulk_confirm.html", context)

    def bulk_progress_view(self, request, operation_id):
        if not self.has_view_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        operation = bulk.get(operation_id)
        if operation is None:
            raise Http404(f"No bulk operation #{operation_id}.")
        state = operation["state"]
        if state == "running" and operation["idle_seconds"] > bulk.STALE_SECONDS:
            state = "interrupted"
            messages.warning(
                request,
                f"This operation has not moved for {operation['idle_seconds']:.0f} s: the web process running it "
                f"stopped. Jobs up to #{operation['last_id']} were done; start it again from the job list to "
                "finish (jobs already done no longer match).",
            )
        walked = operation["done"] + operation["skipped"]
        total = max(operation["total"], walked)
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": f"Bulk {bulk.ACTIONS[operation['action']].title.lower()} #{operation['id']}",
            "opts": self.opts,  # type: ignore[attr-defined]
            "operation": operation,
            "action": bulk.ACTIONS[operation["action"]],
            "state": state,
            "walked": walked,
            "total": total,
            "percent": 100 if not total else round(100 * walked / total),
            "job_url": reverse("admin:shardq_job_changelist"),
        }
        return TemplateResponse(request, "admin/shardq/bulk_progress.html", context)
