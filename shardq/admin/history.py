"""The "Job history" list: finished jobs the archiver moved to
``shardq_job_history`` (docs/architecture.md, "History"), read-only.

The job page's columns and fields, redaction included (it is ``JobAdmin``'s
display code), over the history's table, kept fast at ten million rows
(docs/admin.md, "At ten million jobs"): the job list's paginator (a count
bounded at 1,001 rows, then the planner's estimate; never ``COUNT(*)``),
filters that each have an index of the history's (status, queue, task: each
with the id, the list's order; tag: a GIN) or prune its partitions (the
finish date: the partition key), and the job list's search (id, exact shard
key, task path, an argument's value), each on an index (migrations 0022 and
0025). No action: a finished job in history is a record.
"""

from django.contrib import admin
from django.contrib.admin import ActionLocation
from django.core.exceptions import ObjectDoesNotExist

from ..models import JobHistory
from .jobs import JobAdmin, QueueFilter, TagFilter, TaskPathFilter


class HistoryStatusFilter(admin.SimpleListFilter):
    """The two statuses a job in history has (not the job list's eight)."""

    title = "status"
    parameter_name = "status__exact"

    def lookups(self, request, model_admin):
        return [("SUCCESSFUL", "Successful"), ("FAILED", "Failed (cancelled)")]

    def queryset(self, request, queryset):
        return queryset.filter(status=self.value()) if self.value() else queryset


@admin.register(JobHistory)
class JobHistoryAdmin(JobAdmin):
    """Finished jobs in shardq_job_history: the job list's columns, read-only."""

    # The finish date, not the enqueue date: finished_at is the partition
    # key, so a day's filter reads that day's partition only.
    list_filter: tuple = (
        HistoryStatusFilter,
        QueueFilter,
        TaskPathFilter,
        TagFilter,
        ("finished_at", admin.DateFieldListFilter),
    )
    actions = []

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

    def get_object(self, request, object_id, from_field=None):
        try:
            return super().get_object(request, object_id, from_field)
        except ObjectDoesNotExist:  # JobAdmin's catches Job's only
            return None

    @admin.display(description="workflow")
    def workflow_display(self, obj):
        return obj.workflow or "—"
