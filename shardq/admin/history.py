"""The "Job history" list: finished jobs the archiver moved to
``shardq_job_history`` (docs/architecture.md, "History"), read-only.

The job page's columns and fields, redaction included (it is ``JobAdmin``'s
display code), over the history's table, kept fast at ten million rows: no
``COUNT(*)`` (the page count is the planner's estimate unfiltered, and a
count stopped at ``COUNT_CAP`` rows filtered), filters that each have an
index of the history's (status, queue, task: each with the id, the list's
order), and search by exact id or exact task path only (a substring search
would read every row). No action: a finished job in history is a record.
"""

from functools import cached_property

from django.contrib import admin
from django.contrib.admin import ActionLocation
from django.core.exceptions import ObjectDoesNotExist
from django.core.paginator import Paginator

from ..db import operations
from ..models import JobHistory
from .jobs import JobAdmin, QueueFilter, TaskPathFilter

#: A filtered list counts at most this many rows ("10,000+ pages" past it).
COUNT_CAP = 10_000


class EstimatedPaginator(Paginator):
    """A paginator that never counts millions of rows: unfiltered, the
    planner's estimate of the history's rows (``history_estimate``);
    filtered, a count that stops at COUNT_CAP + 1."""

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not queryset.query.where:
            (estimate, *_rest) = operations.run("history_estimate", fetch="one")
            if estimate > COUNT_CAP:
                return int(estimate)
        return queryset[: COUNT_CAP + 1].count()


@admin.register(JobHistory)
class JobHistoryAdmin(JobAdmin):
    """Finished jobs in shardq_job_history: the job list's columns, read-only."""

    list_filter: tuple = ("status", QueueFilter, TaskPathFilter)
    search_fields: tuple = ("=id", "=task_path")
    search_help_text = "A job id or an exact task path."
    actions = []
    paginator = EstimatedPaginator

    def has_view_permission(self, request, obj=None):
        # Who may read the jobs may read their history.
        return request.user.has_perm("shardq.view_jobhistory") or request.user.has_perm("shardq.view_job")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def get_actions(self, request, action_location=ActionLocation.CHANGE_LIST):
        return {}

    def get_urls(self):
        # No workflow graph, no bulk pages: the model admin's own list and page.
        return admin.ModelAdmin.get_urls(self)

    def changelist_view(self, request, extra_context=None):
        return admin.ModelAdmin.changelist_view(self, request, extra_context)

    def get_search_results(self, request, queryset, search_term):
        # Exact id or task path, each on an index (not JobAdmin's shard-key search).
        return admin.ModelAdmin.get_search_results(self, request, queryset, search_term)

    def get_object(self, request, object_id, from_field=None):
        try:
            return super().get_object(request, object_id, from_field)
        except ObjectDoesNotExist:  # JobAdmin's catches Job's only
            return None

    @admin.display(description="workflow")
    def workflow_display(self, obj):
        return obj.workflow or "—"
