"""The Queues page (docs/admin.md, "Queues"): every queue's live controls
(shardq/queues.py), with Pause / Resume buttons and a concurrency override
form, each a POST behind ``shardq.change_queuecontrol`` and recorded in the
admin's history (LogEntry). Workers obey within a second (a NOTIFY, with
the poll as the fallback)."""

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from .. import queues
from ..models import QueueControl
from .common import ReadOnlyMixin, configured_queues


@admin.register(QueueControl)
class QueuesAdmin(ReadOnlyMixin, admin.ModelAdmin):  # a page of controls, not a list of rows
    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path("", self.admin_site.admin_view(self.queues_view), name="{}_{}_changelist".format(*info)),
            path("control/", self.admin_site.admin_view(self.control_view), name="{}_{}_control".format(*info)),
        ]

    def may_control(self, request) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def queues_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "opts": self.opts,
            "queues": queues.queue_states(configured=configured_queues()),
            "may_control": self.may_control(request),
            "control_url": reverse("admin:shardq_queuecontrol_control"),
            "job_url": reverse("admin:shardq_job_changelist"),
        }
        return TemplateResponse(request, "admin/shardq/queues.html", context)

    def control_view(self, request):
        """One POST: action pause | resume | concurrency (with ``concurrency``,
        empty to clear) for ``queue``."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.may_control(request):
            raise PermissionDenied
        action = request.POST.get("action", "")
        queue = request.POST.get("queue", "")
        back = HttpResponseRedirect(reverse("admin:shardq_queuecontrol_changelist"))
        by = f"admin:{request.user.get_username()}"
        try:
            queues.check_queue_name(queue)
            if action == "pause":
                queues.pause(queue, by=by)
                done = f"Paused queue {queue}: no worker claims its jobs (running jobs finish)."
            elif action == "resume":
                queues.resume(queue, by=by)
                done = f"Resumed queue {queue}."
            elif action == "concurrency":
                raw = request.POST.get("concurrency", "").strip()
                if raw:
                    if not raw.isascii() or not raw.isdigit():
                        raise ValueError(f"concurrency {raw!r}: give a whole number >= 1, or leave it empty to clear")
                    number = int(raw)
                else:
                    number = None
                queues.set_concurrency(queue, number, by=by)
                done = (
                    f"Queue {queue}: concurrency override cleared."
                    if number is None
                    else f"Queue {queue}: at most {number} jobs on each worker at once."
                )
            else:
                raise ValueError(f"unknown action {action!r}: pause, resume or concurrency")
        except ValueError as exc:
            self.message_user(request, f"Nothing changed: {exc}.", messages.ERROR)
            return back
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(QueueControl).pk,
            object_id=queue[:200],
            object_repr=f"queue {queue}"[:200],
            action_flag=CHANGE,
            change_message=done,
        )
        self.message_user(request, done, messages.SUCCESS)
        return back
