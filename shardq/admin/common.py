"""What every shardq admin page shares: database-clock expressions, the
formatting of times, JSON and excerpts, the read-only list base, and the
tasks this process knows (for redaction)."""

import contextlib
import functools
import json
import math
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db import DatabaseError, connections, router
from django.db.models import (
    DateTimeField,
    F,
    FloatField,
    Func,
    TextField,
)
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.urls import URLPattern
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from ..conf import get_config
from ..db import operations
from ..db.errors import tables_missing
from ..exceptions import TablesMissing, UnknownTask
from ..models import Job
from ..tasks import autodiscover, resolve
from .redaction import shard_key_is_sensitive

# -- database-clock expressions ---------------------------------------------


class ClockTimestamp(Func):
    """``clock_timestamp()``: the database's clock, as the lease protocol reads it."""

    template = "clock_timestamp()"
    arity = 0


class SecondsUntil(Func):
    """Seconds from the database's clock to a timestamp (negative: past).

    Infinity-safe: PostgreSQL refuses ``'infinity' - clock_timestamp()``
    ("cannot subtract infinite timestamps"), so the difference is taken
    between epochs (numeric, exact to the microsecond): ±infinity gives
    ±Infinity instead of an error."""

    template = "(extract(epoch FROM %(expressions)s) - extract(epoch FROM clock_timestamp()))::float8"
    arity = 1
    output_field = FloatField()


class SecondsSince(Func):
    """Seconds from a timestamp to the database's clock (infinity-safe, as above)."""

    template = "(extract(epoch FROM clock_timestamp()) - extract(epoch FROM %(expressions)s))::float8"
    arity = 1
    output_field = FloatField()


class Epoch(Func):
    template = "extract(epoch FROM %(expressions)s)"
    arity = 1
    output_field = FloatField()


def seconds_between(start, end) -> Func:
    """``end - start`` in seconds, taken between epochs (infinity-safe, as above)."""
    return Func(
        Epoch(end), Epoch(start), template="(%(expressions)s)::float8", arg_joiner=" - ", output_field=FloatField()
    )


class FiniteTime(Func):
    """A timestamp column, or NULL when it is ±infinity: psycopg cannot load
    an infinite timestamp into a ``datetime``, so an odd row would fail the
    whole page."""

    template = "CASE WHEN isfinite(%(expressions)s) THEN %(expressions)s END"
    arity = 1
    output_field = DateTimeField()


class InfiniteTimeText(Func):
    """``'infinity'`` / ``'-infinity'`` for an infinite timestamp, else NULL."""

    template = "CASE WHEN NOT isfinite(%(expressions)s) THEN (%(expressions)s)::text END"
    arity = 1
    output_field = TextField()


def with_safe_times(queryset, fields):
    """``queryset`` with the timestamp ``fields`` deferred (never loaded) and
    read through ``<field>_finite`` / ``<field>_infinite`` instead (see
    ``time_column``)."""
    annotations = {}
    for name in fields:
        annotations[f"{name}_finite"] = FiniteTime(F(name))
        annotations[f"{name}_infinite"] = InfiniteTimeText(F(name))
    return queryset.defer(*fields).annotate(**annotations)


# Times to the second (Django's default format stops at the minute, and a
# job often lives less than one), in the current time zone; the exact value
# with its microseconds and offset is in the element's datetime and title.
TIME_FORMAT = "Y-m-d H:i:s"


def show_time(value, infinite: str | None = None):
    """A timestamp to the second, as ``<time>``; ``infinite`` is the text of
    an infinite one (``with_safe_times``)."""
    if infinite:
        return infinite
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    exact = local.isoformat()
    # TIME_FORMAT written out (Django's format() costs a visible share of a
    # page of 100 rows); the date may wrap at its hyphens in a narrow column
    # (never inside a number). Digits, hyphens and colons: nothing to escape.
    shown = (
        f"{local.year:04d}-<wbr>{local.month:02d}-<wbr>{local.day:02d} "
        f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}"
    )
    return mark_safe(f'<time datetime="{exact}" title="{exact}">{shown}</time>')


def time_column(name: str, description: str):
    """A display method for a timestamp read through ``with_safe_times``."""

    @admin.display(description=description, ordering=name)
    def show(self, obj):
        return show_time(getattr(obj, f"{name}_finite", None), getattr(obj, f"{name}_infinite", None))

    show.__name__ = f"{name}_display"
    return show


# -- formatting --------------------------------------------------------------


def human_seconds(value: float | None) -> str:
    """A duration for people: ms below a second, then s, min, h."""
    if value is None:
        return "—"
    if not math.isfinite(value):  # a row with an infinite timestamp
        return "∞" if value > 0 else ("−∞" if value < 0 else "—")
    if abs(value) < 1:
        return f"{value * 1000:.1f} ms"
    if abs(value) < 120:
        return f"{value:.2f} s"
    if abs(value) < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def seconds_html(value: float | None):
    """A duration with its exact value in ``data-seconds`` (for people and tests)."""
    if value is None:
        return "—"
    return format_html(
        '<span data-seconds="{}">{}</span>',
        f"{value:.6f}" if math.isfinite(value) else str(value),
        human_seconds(value),
    )


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def short_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def truncate(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Return values, tracebacks and other stored text are shown as bounded
# excerpts: a 50 MB result must not be read into the web process or served.
EXCERPT_CHARS = 10 * 1024
# Arguments larger than this (as JSON text) are not loaded at all: the
# redaction needs them parsed, and a page must stay small.
ARGUMENTS_MAX_BYTES = 64 * 1024
# Errors shown of a job: the oldest and the newest this many each.
ERRORS_SHOWN_EACH_END = 10


def excerpt(text: str, total_bytes: int | None = None, limit: int = EXCERPT_CHARS) -> str:
    """The first ``limit`` characters of ``text`` and, when that is not all
    of it, "… (N bytes)" with the whole value's size."""
    if total_bytes is None:
        if len(text) <= limit:
            return text
        total_bytes = len(text.encode("utf-8", "surrogatepass"))
    elif len(text) <= limit and len(text.encode("utf-8", "surrogatepass")) >= total_bytes:
        return text
    return f"{text[:limit]}… ({total_bytes} bytes)"


_BREAK_AFTER = re.compile(r"([._@/:,=])(?=.)")
# A run of letters and digits longer than this is an identifier (a long
# number, a hash), not a word: it may wrap every IDENTIFIER_PART characters.
LONGEST_WORD = 12
IDENTIFIER_PART = 8
_IDENTIFIER = re.compile(rf"[A-Za-z0-9]{{{LONGEST_WORD + 1},}}")


def _parts(match: re.Match) -> str:
    run = match.group(0)
    return "<wbr>".join(run[i : i + IDENTIFIER_PART] for i in range(0, len(run), IDENTIFIER_PART))


def breakable(text: str):
    """``text`` (escaped) with line-break opportunities (``<wbr>``) after its
    punctuation, and inside identifiers longer than LONGEST_WORD: a long
    name (a task path, a host, a key, arguments) wraps between its parts in
    a narrow column, never inside a word."""
    marked = _BREAK_AFTER.sub(r"\1<wbr>", str(escape(text)))
    return mark_safe(_IDENTIFIER.sub(_parts, marked))


def _pre(text: str):
    return format_html('<pre class="shardq-pre">{}</pre>', text)


# -- lists -------------------------------------------------------------------


class _PlaceholderPk:
    """A row whose primary key is a mark, to reverse a change URL once."""

    MARK = "shardq-pk-placeholder"

    def __init__(self, attname: str) -> None:
        setattr(self, attname, self.MARK)


class SnapshotChangeList(ChangeList):
    """A list whose count is the rows it shows.

    Django counts a list (one statement) and reads its rows (another, while
    the template renders); under READ COMMITTED each sees its own snapshot.
    Jobs change under a running worker every millisecond — right after a
    Retry the retried job runs and may fail again — so a page could say
    "1 result" over 2 rows. A list that fits one page is read here, once,
    and counted from what was read. (A longer list keeps Django's count:
    its page is bounded by LIMIT and the count is of the whole list.)
    """

    def url_for_result(self, result):
        """The row's link, Django's ``reverse`` done once a page: reversing
        (and resolving) the change URL for each of 100 rows is a visible
        share of the list's time at ten million jobs (docs/admin.md)."""
        template = self.__dict__.get("_result_url")
        if template is None:
            template = self._result_url = super().url_for_result(_PlaceholderPk(self.pk_attname))
        return template.replace(_PlaceholderPk.MARK, str(quote(getattr(result, self.pk_attname))), 1)

    def get_results(self, request):
        super().get_results(request)
        if self.multi_page and not (self.show_all and self.can_show_all):
            return
        limit = self.list_max_show_all if self.show_all else self.list_per_page
        rows = list(self.queryset[: limit + 1])
        # More rows than the count promised a page: rows arrived in between;
        # show a page of them, the rest is on the next load.
        self.result_list = rows[:limit]
        self.result_count = len(self.result_list)


class ReadOnlyMixin:
    """No admin page adds, edits or deletes a shardq row. Shard ownership is
    the lease protocol's (and a shard row is never deleted: a claim version
    must never be reused), worker rows are their processes', job rows the
    worker runtime's. The job list's Retry and Discard actions are the only
    writes, each behind its own permission (``JobAdmin``)."""

    @property
    def urls(self) -> list[Any]:
        # Every page of shardq's (lists, details, the workflow graph, the
        # dashboard, limits): before migrate, a page that says so instead
        # of a 500. (ModelAdmin.urls is get_urls(), which some override.)
        urls = self.get_urls()  # type: ignore[attr-defined]
        for pattern in urls:
            if isinstance(pattern, URLPattern):
                pattern.callback = missing_tables_page(pattern.callback, self)
        return urls

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@contextlib.contextmanager
def without_jit(using: str) -> Iterator[None]:
    """PostgreSQL's JIT off on ``using``'s connection while a page runs
    (``SET jit = off``, then ``RESET jit``). Every admin statement reads a
    bounded slice of an index, but the planner costs one over
    shardq_job_history before run-time pruning drops all but its few
    partitions (the dashboard's: 545,000, above ``jit_above_cost``), so
    PostgreSQL compiled it: 27 s of compilation for 1 s of execution at
    ten million jobs on the loaded box (docs/admin.md, "At ten million jobs")."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield
        return
    operations.run("jit_off", using=using, fetch="none")
    try:
        yield
    finally:
        if not connection.needs_rollback and connection.connection is not None:
            try:
                operations.run("jit_reset", using=using, fetch="none")
            except DatabaseError:  # an aborted transaction: its rollback undoes the SET
                pass


def missing_tables_page(view: Any, model_admin: Any) -> Any:
    """``view``, answering "shardq's tables are missing: run manage.py
    migrate" (503) when one of shardq's tables is missing, rather than a
    500 with a traceback. The response is rendered here, so a query the
    template runs is caught too."""

    @functools.wraps(view)
    def page(request, *args, **kwargs):
        try:
            with without_jit(router.db_for_read(model_admin.model)):
                response = view(request, *args, **kwargs)
                if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                    response.render()
            return response
        except (DatabaseError, TablesMissing) as exc:
            missing = exc if isinstance(exc, TablesMissing) else tables_missing(exc)
            if missing is None:
                raise
            context = {
                **model_admin.admin_site.each_context(request),
                "title": "shardq's tables are missing",
                "message": str(missing),
            }
            return TemplateResponse(request, "admin/shardq/tables_missing.html", context, status=503)

    return page


class ShardqModelAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """What every shardq list shares: the stylesheet, no exact total count
    (a scan of a large table), no facets, and counts that match the rows."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    class Media:
        css = {"all": ["shardq/admin.css"]}

    def get_changelist(self, request, **kwargs):
        return SnapshotChangeList


# -- tasks, as this process knows them ---------------------------------------


def task_of(task_path):
    """The Task a job names, or None when this process has not registered it
    (its arguments and shard key are then all hidden: their sensitivity is
    unknown).

    Only the task registry is asked: the tasks the installed apps' ``tasks``
    modules and ``SHARDQ["TASK_MODULES"]`` define (imported once, by
    configuration). A row's ``task_path`` is never imported — viewing a job
    must not run whatever module a row names."""
    if not isinstance(task_path, str):
        return None
    from ..tasks.registry import is_registered

    discover_tasks()
    if not is_registered(task_path):
        return None
    try:
        return resolve(task_path)  # a registered path: answered from the registry, no import
    except UnknownTask:
        return None


def registered_paths() -> frozenset[str]:
    """The task paths registered in this process, after the configured
    modules have been imported once."""
    from ..tasks import registered_task_paths

    discover_tasks()
    return frozenset(registered_task_paths())


@cache
def discover_tasks() -> None:
    """Import the configured task modules once (never a row's task path)."""
    autodiscover(get_config().task_modules)


def known_task_paths() -> tuple[str, ...]:
    """Task paths defined in this process (installed apps' ``tasks`` modules
    and ``SHARDQ["TASK_MODULES"]``): the task filter's choices, found without
    scanning ``shardq_job``."""
    return tuple(sorted(registered_paths()))


def shown_key_task_paths() -> list[str]:
    """Registered tasks whose shard key the admin shows (not sensitive): the
    only jobs the exact shard-key search may match."""
    return [p for p in known_task_paths() if not shard_key_is_sensitive(task_of(p))]


def configured_queues() -> list[str]:
    """Queue names of the configured task backends (the queue filter's choices)."""
    queues = {"default"}
    for options in getattr(settings, "TASKS", {}).values():
        queues.update(options.get("QUEUES") or ())
    return sorted(queues)


def is_dead_lettered(job: Job) -> bool:
    return job.status == "FAILED" and job.attempts >= job.max_attempts
