"""Jobs: lists and filters, arguments shown redacted, and the two
dead-letter actions (Retry, Discard), each one compare-and-set statement."""

import json
from urllib.parse import quote

from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import (
    Case,
    F,
    JSONField,
    Q,
    When,
)
from django.db.models.constants import LOOKUP_SEP
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext

from .. import charts
from ..conf import get_config
from ..core.tags import normalize_tags
from ..db import operations
from ..models import Job
from ..search import argument_filter, parse_argument_search, tags_filter
from .bulk import BulkActionsMixin
from .common import (
    ARGUMENTS_MAX_BYTES,
    ERRORS_SHOWN_EACH_END,
    EXCERPT_CHARS,
    ClockTimestamp,
    ShardqModelAdmin,
    _pre,
    breakable,
    configured_queues,
    excerpt,
    is_dead_lettered,
    known_task_paths,
    pretty_json,
    seconds_between,
    seconds_html,
    short_json,
    shown_key_task_paths,
    task_of,
    time_column,
    truncate,
    with_safe_times,
)
from .paginator import EstimatedCountPaginator
from .redaction import REDACTED, redact_arguments, shard_key_is_sensitive


def searchable_task_paths(name: str) -> list[str]:
    """Registered tasks whose keyword argument ``name`` the admin shows (not
    sensitive, and an argument of the function): the only jobs an argument
    search may match."""
    paths = []
    for task_path in known_task_paths():
        task = task_of(task_path)
        if task is None:
            continue
        _, shown = redact_arguments(task, [], {name: 0})
        if isinstance(shown, dict) and shown.get(name) != REDACTED:
            paths.append(task_path)
    return paths


# Jobs drawn at most in a workflow graph (the ones with the lowest ids).
WORKFLOW_GRAPH_LIMIT = 200

# -- jobs --------------------------------------------------------------------


class DeadLetterFilter(admin.SimpleListFilter):
    """The dead-letter queue: FAILED with every attempt used."""

    title = "dead-letter queue"
    parameter_name = "dead_letter"

    def lookups(self, request, model_admin):
        return [("yes", "dead-lettered (FAILED, out of attempts)"), ("no", "not dead-lettered")]

    def queryset(self, request, queryset):
        dead = Q(status="FAILED", attempts__gte=F("max_attempts"))
        if self.value() == "yes":
            return queryset.filter(dead)
        if self.value() == "no":
            return queryset.exclude(dead)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        return [(q, q) for q in configured_queues()]

    def queryset(self, request, queryset):
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskPathFilter(admin.SimpleListFilter):
    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        # From the task registry, not SELECT DISTINCT over the whole table.
        return [(p, breakable(p)) for p in known_task_paths()]

    def queryset(self, request, queryset):
        return queryset.filter(task_path=self.value()) if self.value() else queryset


class TagFilter(admin.SimpleListFilter):
    """Jobs carrying a tag (``tags @> '["billing"]'``, over shardq_job_tags_idx).
    The choices are the registered tasks' tags; ``?tag=`` takes any other."""

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        # From the task registry, not a scan of the table.
        tags = {tag for path in known_task_paths() for tag in getattr(task_of(path), "tags", ())}
        value = self.value()
        if value and value not in tags:
            tags.add(value)  # a tag given with .using(tags=...), shown while selected
        return [(t, t) for t in sorted(tags)]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            tags = normalize_tags([self.value()], "tag")
        except ValueError as exc:
            messages.warning(request, f"{exc} No job is shown for it.")
            return queryset.none()
        return queryset.filter(tags_filter(tags))


BOTH_LOCATIONS = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]

# The job's timestamp columns, read through with_safe_times.
TIMES = ("enqueued_at", "run_after", "started_at", "last_attempted_at", "finished_at")
# Loaded only as bounded excerpts on the job's page (get_object).
OUTCOME_FIELDS = ("return_value", "errors", "worker_ids", "logs")
# A job's logs are shown whole up to this many characters an attempt (the
# worker keeps SHARDQ["JOB_LOG_BYTES"], 64 KiB, a job; a row written
# otherwise is cut here).
LOG_SHOWN_CHARS = 64 * 1024
# The only fields a URL may filter on (JobAdmin.lookup_allowed): what the
# list filters, the shard map's and the dashboard's links and the id search
# use. Everything else -- arguments, outcomes, the shard key and its hash,
# limit keys, and every annotation of the list's queryset (args_bounded,
# kwargs_bounded, ...) -- is refused: a lookup on a hidden value tells it one
# guess at a time (``?kwargs_bounded__value__password__startswith=h``).
FILTERABLE_FIELDS = frozenset(
    {
        "id",
        "task_path",
        "status",
        "queue_name",
        "shard",
        "attempts",
        "max_attempts",
        *TIMES,
    }
)


NOT_PARSED = object()


def parsed_excerpt(shown: dict):
    """The value of a ``json_excerpt`` (shardq/db/sql/job.sql) when the excerpt is all of it, else NOT_PARSED."""
    if not isinstance(shown, dict) or shown.get("chars", 0) > EXCERPT_CHARS:
        return NOT_PARSED
    try:
        return json.loads(shown.get("text") or "")
    except ValueError:
        return NOT_PARSED


def excerpt_of_json(shown: dict) -> str:
    """A ``json_excerpt`` (shardq/db/sql/job.sql) for people: pretty-printed when it is whole, else
    the first EXCERPT_CHARS characters and "… (N bytes)"."""
    value = parsed_excerpt(shown)
    if value is not NOT_PARSED:
        return excerpt(pretty_json(value))
    text = shown.get("text") or "" if isinstance(shown, dict) else ""
    return f"{text}… ({shown.get('bytes')} bytes)"


def worker_link_bare(worker_id):
    """A worker id (one attempt's) linking to the worker's page; an odd value
    (not a string, empty) shown as it is."""
    if isinstance(worker_id, str) and worker_id:
        try:
            url = reverse("admin:shardq_worker_change", args=[worker_id])
        except NoReverseMatch:
            pass
        else:
            return format_html('<a href="{}">{}</a>', url, truncate(worker_id, 80))
    return format_html('<span class="shardq-odd">{}</span>', truncate(short_json(worker_id), 80))


# A durable record's output or payload on the job page: at most this much JSON.
DURABLE_OUTPUT_CHARS = 300


@admin.register(Job)
class JobAdmin(BulkActionsMixin, ShardqModelAdmin):
    """Jobs: filters, search, redacted arguments, readable tracebacks, and the
    dead-letter actions (Retry, Discard), each behind its own permission."""

    list_display = (
        "id",
        "task_path_display",
        "queue_name",
        "status_display",
        "attempts_display",
        "shard",
        "shard_key_display",
        "arguments_display",
        "enqueued_at_display",
        "waited_display",
        "ran_display",
        "finished_at_display",
    )
    list_filter = (
        "status",
        DeadLetterFilter,
        QueueFilter,
        TaskPathFilter,
        TagFilter,
        ("enqueued_at", admin.DateFieldListFilter),
    )
    # get_search_results reads the term itself (every kind of term through
    # an index); search_fields only makes Django show the search box.
    search_fields = ("=id",)
    search_help_text = (
        "A job id, an exact shard key, part of a task's path, or a keyword argument's value: "
        'customer_id=7 (also args.customer_id=7; "7" for text only, {"a": 1} for part of a nested value). '
        "Sensitive arguments are never searched."
    )
    # Ten million rows (docs/admin.md): no COUNT(*) over the table. The
    # paginator counts at most 1,001 rows and estimates past that, the
    # "N total" beside the search is not shown, nor the filters' facet counts.
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    ordering = ("-id",)
    actions = ["retry_failed", "discard_failed"]
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "task_path",
                    "status_display",
                    "queue_name",
                    "priority",
                    "backend",
                    "tags_display",
                    "workflow_display",
                )
            },
        ),
        ("Arguments", {"fields": ("args_display", "kwargs_display", "redaction")}),
        ("Outcome", {"fields": ("return_value_display", "errors_display", "worker_ids_display")}),
        ("Logs", {"fields": ("logs_display",)}),
        (
            "Shard and attempts",
            {
                "fields": (
                    "shard",
                    "shard_key_display",
                    "key_hash_display",
                    "ordered",
                    "attempts",
                    "max_attempts",
                    "worker_losses_display",
                    "status_rank",
                    "fence",
                )
            },
        ),
        (
            "Times",
            {
                "fields": (
                    "enqueued_at_display",
                    "run_after_display",
                    "started_at_display",
                    "last_attempted_at_display",
                    "finished_at_display",
                    "waited_display",
                    "ran_display",
                    "total_display",
                )
            },
        ),
    )
    readonly_fields = (
        "durable_display",
        "signals_display",
        "status_display",
        "workflow_display",
        "tags_display",
        "args_display",
        "kwargs_display",
        "redaction",
        "return_value_display",
        "errors_display",
        "worker_ids_display",
        "logs_display",
        "shard_key_display",
        "key_hash_display",
        "worker_losses_display",
        *(f"{name}_display" for name in TIMES),
        "waited_display",
        "ran_display",
        "total_display",
    )

    def action_checkbox(self, obj):
        """Django's row checkbox, written out: Django renders a form widget's
        template for each of the page's 100 rows, a visible share of the
        list's time at ten million jobs (docs/admin.md). The same HTML."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            format_html(gettext("Select this object for an action - {}"), str(obj)),
        )

    def get_queryset(self, request):
        # The stored values that may be large or odd are never loaded as
        # they are: arguments only up to ARGUMENTS_MAX_BYTES (as JSON
        # text), outcomes only as bounded excerpts (get_object), timestamps
        # through with_safe_times (an infinite one cannot be loaded).
        queryset = super().get_queryset(request).defer("args", "kwargs", *OUTCOME_FIELDS)
        now = ClockTimestamp()
        waiting = Q(status__in=["READY", "CLAIMED"])
        bounded = {"max_bytes": ARGUMENTS_MAX_BYTES}
        return with_safe_times(queryset, TIMES).annotate(
            args_bounded=operations.expression("admin_job_args_bounded", bounded, JSONField()),
            kwargs_bounded=operations.expression("admin_job_kwargs_bounded", bounded, JSONField()),
            # The pickup latency of the dashboard: from due (run_after) to
            # the start of the final attempt; a job not started yet, so far.
            waited_seconds=Case(
                When(waiting & Q(run_after__lte=now), then=seconds_between(F("run_after"), now)),
                When(waiting, then=None),
                default=seconds_between(F("run_after"), Coalesce(F("last_attempted_at"), F("finished_at"))),
            ),
            # The final attempt's run: from its start to the outcome; a
            # running job, so far.
            ran_seconds=Case(
                When(
                    status__in=["SUCCESSFUL", "FAILED"], then=seconds_between(F("last_attempted_at"), F("finished_at"))
                ),
                When(status="RUNNING", then=seconds_between(F("last_attempted_at"), now)),
                default=None,
            ),
            total_seconds=seconds_between(F("enqueued_at"), F("finished_at")),
        )

    def get_object(self, request, object_id, from_field=None):
        """The job of the change page, with its outcome as bounded excerpts."""
        chars = {"chars": EXCERPT_CHARS}
        queryset = self.get_queryset(request).annotate(
            return_value_excerpt=operations.expression("admin_job_return_value_excerpt", chars, JSONField()),
            worker_ids_excerpt=operations.expression("admin_job_worker_ids_excerpt", chars, JSONField()),
            errors_excerpt=operations.expression(
                "admin_job_errors_excerpt", {**chars, "each_end": ERRORS_SHOWN_EACH_END}, JSONField()
            ),
            logs_excerpt=operations.expression("admin_job_logs_excerpt", {"chars": LOG_SHOWN_CHARS}, JSONField()),
        )
        field = Job._meta.pk if from_field is None else Job._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (Job.DoesNotExist, ValidationError, ValueError):
            return None

    def get_fieldsets(self, request, obj=None):
        """The fieldsets, with "Durable" (steps, cursors, suspensions,
        signals) for a job that recorded any or was signalled."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None and (self._durable_rows(obj)[0] or self._durable_rows(obj)[1]):
            fieldsets = (*fieldsets, ("Durable", {"fields": ("durable_display", "signals_display")}))
        return fieldsets

    def _durable_rows(self, obj) -> tuple[list, list]:
        """(steps, signals) of the job, read once a page (shardq/durable.py)."""
        cached = getattr(obj, "_durable_rows", None)
        if cached is None:
            params = {"id": obj.pk, "chars": DURABLE_OUTPUT_CHARS}
            cached = (
                operations.run("admin_job_steps", params, using=obj._state.db or "default", named=True),
                operations.run("admin_job_signals", params, using=obj._state.db or "default", named=True),
            )
            obj._durable_rows = cached
        return cached

    @admin.display(description="steps, iterations and suspensions")
    def durable_display(self, obj):
        steps, _ = self._durable_rows(obj)
        if not steps:
            return "none"
        rows = []
        for step in steps:
            output = step["output"] or ""
            if step["output_chars"] and step["output_chars"] > len(output):
                output += f"… ({step['output_chars']} characters)"
            if step["kind"] == "iterate":
                progress = f"{step['batches']} batches"
                if step["total"]:
                    progress += f" of {step['total']} items"
                state = "done" if step["done"] else progress
            elif step["kind"] in ("sleep", "wait"):
                state = (
                    "done"
                    if step["done"]
                    else f"until {step['until']:%Y-%m-%d %H:%M:%S}"
                    if step["until"]
                    else "waiting"
                )
            else:
                state = "recorded"
            rows.append((step["name"], step["kind"], output, state, f"{step['updated_at']:%Y-%m-%d %H:%M:%S}"))
        return format_html(
            '<table class="shardq-durable"><thead><tr><th>name</th><th>kind</th><th>output / cursor</th>'
            "<th>state</th><th>when</th></tr></thead><tbody>{}</tbody></table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.display(description="signals received")
    def signals_display(self, obj):
        _, signals = self._durable_rows(obj)
        if not signals:
            return "none"
        rows = [
            (
                signal["name"],
                signal["payload"] or "null",
                f"{signal['sent_at']:%Y-%m-%d %H:%M:%S}",
                f"consumed {signal['consumed_at']:%Y-%m-%d %H:%M:%S}" if signal["consumed_at"] else "not consumed yet",
            )
            for signal in signals
        ]
        return format_html(
            '<table class="shardq-signals"><tbody>{}</tbody></table>',
            format_html_join("", "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>", rows),
        )

    def lookup_allowed(self, lookup, value, request=None):
        """An allow-list: a URL may filter on FILTERABLE_FIELDS only (the
        list filters, id, task path, status, queue, shard, attempts and the
        times), with a plain lookup (``shard__exact``, ``id__in``,
        ``finished_at__gte``). Anything else -- ``?kwargs__password__startswith=a``,
        or the same through an annotation (``kwargs_bounded__value__...``)
        -- would tell a hidden value one guess at a time, and is Django's
        DisallowedModelAdminLookup (400)."""
        if lookup in {item.parameter_name for item in self.list_filter if isinstance(item, type)}:
            # The list's own filters (dead letter, queue, task): each maps its
            # parameter to a fixed query of its own, never to a hidden value.
            return super().lookup_allowed(lookup, value, request)
        name, _, rest = lookup.partition(LOOKUP_SEP)
        if name == "pk":
            name = "id"
        if name not in FILTERABLE_FIELDS:
            return False
        if rest and not all(part in Job._meta.get_field(name).get_lookups() for part in rest.split(LOOKUP_SEP)):
            return False  # a transform: nothing to filter on that a plain lookup does not give
        return super().lookup_allowed(lookup, value, request)

    def changelist_view(self, request, extra_context=None):
        """The job list, with a warning naming jobs no worker will ever run
        (a shard out of range, WAITING on nothing): they would sit silently."""
        if request.method == "GET":
            from ..management.commands.shardq_status import silent_rows

            url = reverse("admin:shardq_job_changelist")
            for row in silent_rows(get_config().shard_count):
                ids = ",".join(map(str, row["ids"]))
                messages.warning(
                    request,
                    format_html(
                        '{} job(s) no worker will ever run ({}): <a href="{}?id__in={}">{}</a>{}. {}.',
                        row["count"],
                        row["reason"],
                        url,
                        ids,
                        ", ".join(f"#{i}" for i in row["ids"]),
                        " …" if row["count"] > len(row["ids"]) else "",
                        row["what_to_do"].capitalize(),
                    ),
                )
        extra_context = {**(extra_context or {}), "shardq_bulk_buttons": self.bulk_buttons(request)}
        return super().changelist_view(request, extra_context)

    def get_search_results(self, request, queryset, search_term):
        """One of, each through an index (ten million rows: docs/admin.md):

        - ``name=value`` (``args.name=value``, ``kwargs.name=value``): jobs
          enqueued with that keyword argument's value (shardq_job_kwargs_idx),
          among the tasks whose argument ``name`` the admin shows: a match on
          a sensitive (or unknown) task's argument would confirm a guess;
        - anything else: the job of that id (digits), the jobs of that exact
          shard key (shardq_job_key_idx) among the tasks whose key the admin
          shows, and the jobs of the registered tasks whose path holds the
          term (shardq_job_task_idx; the paths come from the registry, not
          from a scan of the table)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        parsed = parse_argument_search(term)
        if parsed is not None:
            name, values = parsed
            paths = searchable_task_paths(name)
            if not paths:
                messages.info(
                    request,
                    f"No task defined in this process has an argument {name!r} the admin shows "
                    "(a sensitive argument is never searched): no job matches.",
                )
                return queryset.none(), False
            match = argument_filter([{name: value} for value in values], queryset.model)
            return queryset.filter(match, task_path__in=paths), False
        found = Q(shard_key=term, task_path__in=shown_key_task_paths())
        if term.isdigit() and int(term) < 2**63:
            found |= Q(id=int(term))
        paths = [p for p in known_task_paths() if term.lower() in p.lower()]
        if paths:
            found |= Q(task_path__in=paths)
        return queryset.filter(found), False

    def has_retry_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.retry_job")

    def has_discard_permission(self, request):
        return request.user.has_perm(f"{self.opts.app_label}.discard_job")

    # -- the workflow graph (issue 16) --

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        graph = path(
            "<path:object_id>/workflow/",
            self.admin_site.admin_view(self.workflow_view),
            name="{}_{}_workflow".format(*info),
        )
        return [graph, *self.bulk_urls(), *super().get_urls()]

    @admin.display(description="workflow")
    def workflow_display(self, obj):
        """A link to the graph of the workflow the job belongs to (— for a job with no edges)."""
        if not operations.run("has_edges", {"id": obj.pk}, fetch="one")[0]:
            return "—"
        url = reverse("admin:shardq_job_workflow", args=[obj.pk])
        return format_html('<a href="{}" class="shardq-workflow-link">{} graph</a>', url, obj.workflow or "workflow")

    def workflow_view(self, request, object_id):
        """The jobs connected to this one by edges, as a server-drawn SVG:
        each job's status and task, each edge an arrow from parent to child."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        job = self.get_object(request, object_id)
        if job is None:
            raise Http404(f"No job with the id {object_id!r}.")
        rows = operations.run("workflow_graph", {"id": job.pk, "limit": WORKFLOW_GRAPH_LIMIT})
        nodes = []
        edges = []
        names = {}
        for kind, first, child, status, task_path, _workflow, name in rows:
            if kind == "node":
                nodes.append(
                    {
                        "id": first,
                        "status": status,
                        "css": f"shardq-node-{str(status).lower()}",
                        "task": truncate(str(task_path).rsplit(".", 1)[-1], 22),
                        "url": reverse("admin:shardq_job_change", args=[first]),
                        "current": first == job.pk,
                    }
                )
            else:
                edges.append((first, child))
                names[(first, child)] = name
        graph = charts.graph_layout(nodes, edges)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Workflow {job.workflow or ''} of job {job.pk}".replace("  ", " "),
            "opts": self.opts,
            "job": job,
            "graph": graph,
            "truncated": len(nodes) >= WORKFLOW_GRAPH_LIMIT,
            "limit": WORKFLOW_GRAPH_LIMIT,
            "statuses": sorted({n["status"] for n in nodes}),
        }
        return TemplateResponse(request, "admin/shardq/workflow.html", context)

    # -- columns and fields --

    @admin.display(description="status", ordering="status")
    def status_display(self, obj):
        if is_dead_lettered(obj):
            return format_html(
                '<span class="shardq-badge shardq-dead" data-status="{}">{}</span>', "FAILED", "FAILED · dead-letter"
            )
        return format_html(
            '<span class="shardq-badge shardq-{}" data-status="{}">{}</span>',
            obj.status.lower(),
            obj.status,
            obj.status,
        )

    enqueued_at_display = time_column("enqueued_at", "enqueued at")
    run_after_display = time_column("run_after", "run after")
    started_at_display = time_column("started_at", "started at")
    last_attempted_at_display = time_column("last_attempted_at", "last attempted at")
    finished_at_display = time_column("finished_at", "finished at")

    @admin.display(description="waited")
    def waited_display(self, obj):
        """How long it waited once due for its final attempt to start (so far, when it has not started)."""
        if obj.waited_seconds is None:
            return "—"
        if obj.status in ("READY", "CLAIMED"):
            return format_html(
                '{}<span class="shardq-so-far" title="not started yet: so far">…</span>',
                seconds_html(obj.waited_seconds),
            )
        return seconds_html(obj.waited_seconds)

    @admin.display(description="ran")
    def ran_display(self, obj):
        """How long its final attempt ran (so far, while it runs)."""
        if obj.ran_seconds is None:
            return "—"
        if obj.status == "RUNNING":
            return format_html(
                '{}<span class="shardq-so-far" title="running: so far">…</span>', seconds_html(obj.ran_seconds)
            )
        return seconds_html(obj.ran_seconds)

    @admin.display(description="enqueued → finished")
    def total_display(self, obj):
        return seconds_html(obj.total_seconds)

    @admin.display(description="tags")
    def tags_display(self, obj):
        tags = obj.tags if isinstance(obj.tags, list) else []
        if not tags:
            return "—"
        url = reverse("admin:shardq_job_changelist")
        return format_html_join(
            " ",
            '<a class="shardq-tag" href="{}?tag={}">{}</a>',
            ((url, quote(str(t)), truncate(str(t), 40)) for t in tags),
        )

    @admin.display(description="task path", ordering="task_path")
    def task_path_display(self, obj):
        # The job's tags under its task path, not a column of their own: the
        # list fits 1,400 px (tests/browser/test_layout.py).
        tags = obj.tags if isinstance(obj.tags, list) else []
        if not tags:
            return breakable(obj.task_path)
        return format_html("{}<br>{}", breakable(obj.task_path), self.tags_display(obj))

    @admin.display(description="attempts")
    def attempts_display(self, obj):
        if not obj.worker_losses:
            return f"{obj.attempts}/{obj.max_attempts}"
        # "2/1" alone reads as past the cap: an attempt a lost worker
        # interrupted runs again whatever max_attempts says (at-least-once).
        return format_html(
            '{}/{} <span class="shardq-lost" title="{}">({} lost)</span>',
            obj.attempts,
            obj.max_attempts,
            "attempts interrupted by a lost worker run again whatever max_attempts says",
            obj.worker_losses,
        )

    @admin.display(description="why it ran again")
    def worker_losses_display(self, obj):
        """Said in words: how many attempts a lost worker interrupted, and why
        the job ran again (past max_attempts, if need be)."""
        if not obj.worker_losses:
            return "—"
        limit = get_config().max_worker_losses
        counted = "One attempt" if obj.worker_losses == 1 else f"{obj.worker_losses} attempts"
        return (
            f"{counted} of this job stopped without an outcome: its worker was lost (killed, or its lease "
            "ran out, e.g. a shutdown whose --grace ran out) and the job was rescued. An interrupted attempt "
            "runs again whatever max_attempts says (at-least-once), so attempts may exceed max_attempts; "
            f"after {limit} lost workers (SHARDQ['MAX_WORKER_LOSSES']) the job is dead-lettered as WorkerLost."
        )

    @admin.display(description="shard key")
    def shard_key_display(self, obj):
        if obj.shard_key is None:
            return "—"
        if shard_key_is_sensitive(task_of(obj.task_path)):
            return REDACTED
        return breakable(truncate(obj.shard_key, 60))

    @admin.display(description="key hash")
    def key_hash_display(self, obj):
        # The 32-bit hash of a sensitive key would let a guess be checked.
        if obj.shard_key is not None and shard_key_is_sensitive(task_of(obj.task_path)):
            return REDACTED
        return obj.key_hash

    def _shown_arguments(self, obj):
        """(args, kwargs) redacted, or None when they are too large to load."""
        args, kwargs = obj.args_bounded, obj.kwargs_bounded
        if not isinstance(args, dict) or not isinstance(kwargs, dict):
            return None
        if args.get("bytes", 0) > ARGUMENTS_MAX_BYTES or kwargs.get("bytes", 0) > ARGUMENTS_MAX_BYTES:
            return None
        return redact_arguments(task_of(obj.task_path), args.get("value"), kwargs.get("value"))

    def _too_large(self, obj) -> str:
        sizes = [(obj.args_bounded or {}).get("bytes"), (obj.kwargs_bounded or {}).get("bytes")]
        return (
            f"(arguments too large to show: {sizes[0]} bytes of args, {sizes[1]} bytes of kwargs; "
            f"at most {ARGUMENTS_MAX_BYTES} bytes each are shown)"
        )

    @admin.display(description="arguments")
    def arguments_display(self, obj):
        shown = self._shown_arguments(obj)
        if shown is None:
            return self._too_large(obj)
        args, kwargs = shown
        parts = []
        parts += [short_json(a) for a in args] if isinstance(args, list) else [short_json(args)]
        if isinstance(kwargs, dict):
            parts += [f"{k}={short_json(v)}" for k, v in kwargs.items()]
        else:
            parts.append(short_json(kwargs))
        return format_html('<code class="shardq-args">{}</code>', breakable(truncate(", ".join(parts))))

    @admin.display(description="args")
    def args_display(self, obj):
        shown = self._shown_arguments(obj)
        return self._too_large(obj) if shown is None else _pre(excerpt(pretty_json(shown[0])))

    @admin.display(description="kwargs")
    def kwargs_display(self, obj):
        shown = self._shown_arguments(obj)
        return self._too_large(obj) if shown is None else _pre(excerpt(pretty_json(shown[1])))

    @admin.display(description="redaction")
    def redaction(self, obj):
        task = task_of(obj.task_path)
        if task is None:
            return (
                f"The task {obj.task_path} is not defined in this process, so which arguments "
                "are sensitive is unknown: every argument is hidden."
            )
        marked = getattr(task, "sensitive", ())
        if marked is True:
            return "Every argument is marked sensitive (sensitive=True)."
        if marked:
            return "Marked sensitive: " + ", ".join(marked) + "."
        return "No argument is marked sensitive."

    @admin.display(description="return value")
    def return_value_display(self, obj):
        shown = getattr(obj, "return_value_excerpt", None)
        if shown is None:  # SQL NULL: no return value (yet)
            return "—"
        return _pre(excerpt_of_json(shown))

    @admin.display(description="errors (oldest first)")
    def errors_display(self, obj):
        shown = getattr(obj, "errors_excerpt", None) or {}
        errors, count = shown.get("errors") or [], shown.get("count") or 0
        if not errors:
            return "none"
        items = []
        for error in errors:
            if "raw" in error:  # not an object: the raw JSON
                path, text = "?", excerpt(error["raw"] or "", error.get("raw_bytes"))
            else:
                path = truncate(str(error.get("exception_class_path") or "?"), 300)
                text = excerpt(error.get("traceback") or "", error.get("traceback_bytes"))
            items.append((error.get("n"), path, text))
        return render_to_string(
            "admin/shardq/fragments/errors.html",
            {"errors": items, "more": count > len(errors), "count": count, "each_end": ERRORS_SHOWN_EACH_END},
        )

    @admin.display(description="logged by the task (per attempt)")
    def logs_display(self, obj):
        """Each attempt's log (per-job logs, shardq/worker/joblogs.py),
        oldest first, escaped, in a monospace block."""
        shown = getattr(obj, "logs_excerpt", None)
        if not shown or not isinstance(shown, list):
            return "none"
        items = []
        for entry in shown:
            if not isinstance(entry, dict):
                continue
            if "raw" in entry:  # not an object: the raw JSON
                items.append(("?", excerpt(entry["raw"] or "", entry.get("raw_bytes"), LOG_SHOWN_CHARS)))
            else:
                text = excerpt(entry.get("text") or "", entry.get("text_bytes"), LOG_SHOWN_CHARS)
                items.append((truncate(str(entry.get("attempt") or "?"), 20), text))
        return render_to_string("admin/shardq/fragments/logs.html", {"logs": items})

    @admin.display(description="worker ids (one per attempt)")
    def worker_ids_display(self, obj):
        shown = getattr(obj, "worker_ids_excerpt", None)
        if not shown:
            return "none"
        ids = parsed_excerpt(shown)
        if ids is NOT_PARSED or not isinstance(ids, list):
            return _pre(excerpt_of_json(shown))  # an odd row: the raw value, bounded
        if not ids:
            return "none"
        return format_html_join(", ", "{}", ((worker_link_bare(w),) for w in ids))

    # -- dead-letter actions --

    @admin.action(
        description="Retry selected FAILED jobs (READY now, fresh attempts)",
        permissions=["retry"],
        location=BOTH_LOCATIONS,
    )
    def retry_failed(self, request, queryset):
        if not self.has_retry_permission(request):  # the action list already hides it
            raise PermissionDenied
        ids, requested = self._selection(request, queryset)
        config = get_config()
        done = []
        if ids:
            with transaction.atomic():
                # One compare-and-set UPDATE (status = 'FAILED'); workers are
                # woken through the shard's NOTIFY when this commits.
                rows = operations.run(
                    "admin_retry_failed_jobs", {"ids": ids, "notify": config.notify, "channel": config.channel}
                )
                done = [(row[0], row[1]) for row in rows]
                # Workflow children these jobs cancelled (ParentFailed), and
                # theirs, wait again (shardq/workflows.py).
                revived = operations.run("revive_children", {"ids": [job_id for job_id, _ in done]})
                self._log(request, done, CHANGE, "Retried from the admin: READY with a fresh attempt budget.")
                if revived:
                    messages.info(
                        request,
                        f"{len(revived)} workflow job(s) these had cancelled wait for them again: "
                        + ", ".join(str(row[0]) for row in sorted(revived)[:20]),
                    )
        self._report(request, "Retried", "now READY with a fresh attempt budget", requested, done)

    @admin.action(
        description="Discard (delete) selected FAILED jobs",
        permissions=["discard"],
        location=BOTH_LOCATIONS,
    )
    def discard_failed(self, request, queryset):
        if not self.has_discard_permission(request):
            raise PermissionDenied
        ids, requested = self._selection(request, queryset)
        done = []
        if ids:
            with transaction.atomic():
                # One compare-and-set DELETE (status = 'FAILED').
                done = [(row[0], row[1]) for row in operations.run("admin_discard_failed_jobs", {"ids": ids})]
                self._log(request, done, DELETION, "Discarded from the admin.")
        self._report(request, "Discarded", "deleted", requested, done)
        match = request.resolver_match
        if done and match is not None and match.url_name == "shardq_job_change":
            # Run from the job's own page, which is gone now: back to the list.
            return HttpResponseRedirect(reverse("admin:shardq_job_changelist"))

    @staticmethod
    def _selection(request, queryset) -> tuple[list[int], set[int]]:
        """The ids to act on (the selection within the page's filters, as
        Django hands it over) and the ids the operator asked for: a job
        ticked while FAILED may have left the filtered list by now (another
        operator retried it), and is reported as skipped rather than
        silently dropped."""
        ids = list(queryset.values_list("id", flat=True))
        requested = set(ids)
        if request.POST.get("select_across") != "1":
            requested.update(int(v) for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if v.isdigit())
        return ids, requested

    def _log(self, request, rows, flag, message):
        """One admin history entry a job written (in the action's transaction)."""
        if not rows:
            return
        content_type = ContentType.objects.get_for_model(Job)
        LogEntry.objects.bulk_create(
            LogEntry(
                user_id=request.user.pk,
                content_type_id=content_type.pk,
                object_id=str(job_id),
                object_repr=f"{task_path}#{job_id}"[:200],
                action_flag=flag,
                change_message=message,
            )
            for job_id, task_path in rows
        )

    def _report(self, request, verb, outcome, selected, done):
        done_ids = {job_id for job_id, _ in done}
        skipped = sorted(set(selected) - done_ids)
        if done_ids:
            noun = "job" if len(done_ids) == 1 else "jobs"
            self.message_user(request, f"{verb} {len(done_ids)} {noun}: {outcome}.", messages.SUCCESS)
        if skipped:
            shown = ", ".join(f"#{i}" for i in skipped[:20]) + (" …" if len(skipped) > 20 else "")
            noun = "job" if len(skipped) == 1 else "jobs"
            self.message_user(
                request,
                f"Skipped {len(skipped)} {noun} not FAILED (any more): {shown}. Only FAILED jobs "
                "can be retried or discarded; a job that changed meanwhile is left as it is.",
                messages.WARNING,
            )
