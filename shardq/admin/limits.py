"""The limits page (docs/limits.md): every concurrency and rate limit in use
or waited on, its capacity, slots in use, who holds them, waiting jobs and a
rate's tokens now (``shardq.limits.limit_report``; the same figures as
``shardq_status``). Read-only."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..conf import get_config
from ..limits import limit_report
from ..models import LimitSlot
from .common import ReadOnlyMixin


@admin.register(LimitSlot)
class LimitsAdmin(ReadOnlyMixin, admin.ModelAdmin):  # a report, not a list of rows
    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [path("", self.admin_site.admin_view(self.limits_view), name="{}_{}_changelist".format(*info))]

    def limits_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Limits",
            "opts": self.opts,
            "limits": limit_report(),
            "job_url": reverse("admin:shardq_job_changelist"),
            "lease_ttl": get_config().lease_ttl_seconds,
        }
        return TemplateResponse(request, "admin/shardq/limits.html", context)
