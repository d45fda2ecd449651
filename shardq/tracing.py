"""OpenTelemetry traces (``shardq[otel]``, docs/operations.md "OpenTelemetry").

A PRODUCER span for each enqueue (``send <queue>``) and a CONSUMER span for
each attempt (``process <queue>``). The enqueue span's W3C ``traceparent``
is stored in the job's row (``shardq_job.traceparent``), so each attempt's
span is its child: the request that enqueued, the enqueue and every attempt
(a retry included) are one trace. A workflow enqueues one ``send`` span per
step, each linked to its parents' steps (the spans of parents that existed
already, ``after=[result]``, through their stored traceparent).

Attributes follow OpenTelemetry's messaging semantic conventions:
``messaging.system`` = ``"shardq"``, ``messaging.destination.name`` = the
queue, ``messaging.message.id`` = the job id, ``messaging.operation.type``
(``send``, ``process``), plus ``shardq.task``, ``shardq.attempt``,
``shardq.shard`` and ``shardq.outcome``. A job's arguments are never an
attribute; an error is recorded on the span (``exception`` event, status
ERROR) with the values of the task's ``sensitive=`` arguments replaced by
``[redacted]`` in its message and stack trace.

Off, at no cost, when ``opentelemetry-api`` is not installed: the import is
tried once, here, and every call site tests ``tracing.enabled`` first. With
the API but no SDK set up (``active()`` False) no span is made: an attempt
costs one check of the global tracer provider, and an enqueue stores the
context of the current span when it has a valid one (bench/tracing_overhead.py
measures the drain).
"""

import contextlib
import inspect
import json
import os
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

try:  # once: the rest of shardq reads ``enabled``
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # tests/integration/test_tracing.py hides the package and reloads this module
    _trace = None  # type: ignore[assignment]

#: Is ``opentelemetry-api`` importable? (False: every hook is skipped.)
enabled: bool = _trace is not None

SYSTEM = "shardq"
REDACTED = "[redacted]"
# What an error recorded on a span may hold of its message and trace.
MAX_ERROR_CHARS = 8192

if _trace is not None:
    _propagator = TraceContextTextMapPropagator()
    _tracer = _trace.get_tracer("shardq")
    # Providers that make only no-op spans: none set up (the API's proxy), or
    # the API's own no-op one.
    _NO_SDK = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)


def active() -> bool:
    """Is a tracer provider set up (an SDK)? Without one every span would
    be the API's no-op, so none is made: an attempt costs one check, and an
    enqueue stores the context of the current span (a request's, carried
    from an upstream service) when it has a valid one."""
    if not enabled:
        return False
    # The API's global, read as get_tracer_provider() reads it but without
    # its environment lookup: None until a provider is set (for good: it
    # cannot be unset), unless the environment names one to load.
    if getattr(_trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_FROM_ENVIRONMENT:
        return False
    return not isinstance(_trace.get_tracer_provider(), _NO_SDK)


_UNKNOWN = object()
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _traceparent(span: Any) -> str | None:
    """The W3C traceparent of ``span`` (None: not a valid span context)."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _context_of(traceparent: str | None) -> Any:
    """The OpenTelemetry Context a stored traceparent names (None: none)."""
    if not traceparent:
        return None
    return _propagator.extract({"traceparent": traceparent})


def _span_context(traceparent: str | None) -> Any:
    context = _context_of(traceparent)
    if context is None:
        return None
    span_context = _trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


# -- enqueue --------------------------------------------------------------------------


@contextlib.contextmanager
def enqueue_span(task: Any, args: Sequence[Any] = (), kwargs: dict | None = None, *, jobs: int = 1) -> Iterator[Any]:
    """The current PRODUCER span of one enqueue call (``jobs`` of ``task``);
    an error leaving it is recorded (sensitive values redacted)."""
    queue = getattr(task, "queue_name", "default")
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "shardq.task": getattr(task, "module_path", str(task)),
    }
    if jobs != 1:
        attributes["messaging.batch.message_count"] = jobs
    if not active():
        yield _trace.get_current_span()  # non-recording: only its context is stored
        return
    with _tracer.start_as_current_span(
        f"send {queue}",
        kind=SpanKind.PRODUCER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            record_error(span, task, args, kwargs or {}, error)
            raise


@contextlib.contextmanager
def workflow_span(steps: int, workflow: str | None) -> Iterator[Any]:
    """The current PRODUCER span of a workflow's enqueue (its steps' spans are children)."""
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.batch.message_count": steps,
    }
    if workflow:
        attributes["shardq.workflow"] = workflow
    if not active():
        yield _trace.get_current_span()
        return
    with _tracer.start_as_current_span(
        "send workflow", kind=SpanKind.PRODUCER, attributes=attributes, record_exception=False
    ) as span:
        yield span


def traceparent(span: Any) -> str | None:
    """What a job enqueued under ``span`` stores (None: nothing to continue)."""
    return _traceparent(span)


def enqueued(span: Any, job_ids: Sequence[str]) -> None:
    """The stored job's id on its enqueue span (one job: ``messaging.message.id``)."""
    if len(job_ids) == 1 and span.is_recording():
        span.set_attribute("messaging.message.id", str(job_ids[0]))


def step_spans(steps: Sequence[Any], nodes: Sequence[dict], parent_traceparents: dict[int, str | None]) -> list[Any]:
    """One started PRODUCER span per workflow step (children of the current
    span), each linked to its parents' step spans and to the stored spans of
    the existing jobs it waits on (``parent_traceparents``: job id ->
    traceparent); each node's ``traceparent`` set to its span's. The caller
    ends them (``end_step_spans``). Without an SDK: no spans, each node
    stores the current span's context."""
    if not active():
        current = _traceparent(_trace.get_current_span())
        for node in nodes:
            node["traceparent"] = current
        return []
    spans: list[Any] = []
    contexts: list[Any] = []
    for step, node in zip(steps, nodes, strict=True):
        links = [Link(contexts[parent.index]) for parent in step.parents if contexts[parent.index] is not None]
        for job_id in step.external:
            stored = _span_context(parent_traceparents.get(job_id))
            if stored is not None:
                links.append(Link(stored))
        queue = node["queue_name"]
        span = _tracer.start_span(
            f"send {queue}",
            kind=SpanKind.PRODUCER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "shardq.task": node["task_path"],
                "shardq.step": step.name,
            },
        )
        context = span.get_span_context()
        spans.append(span)
        contexts.append(context if context.is_valid else None)
        node["traceparent"] = _traceparent(span)
    return spans


def end_step_spans(spans: Sequence[Any], job_ids: Sequence[int] | None, error: BaseException | None = None) -> None:
    for index, span in enumerate(spans):
        if job_ids is not None and span.is_recording():
            span.set_attribute("messaging.message.id", str(job_ids[index]))
        if error is not None and span.is_recording():
            span.set_status(Status(StatusCode.ERROR, _class_path(error)))
        span.end()


# -- attempts -------------------------------------------------------------------------


@contextlib.contextmanager
def attempt_span(job: Any) -> Iterator[Any]:
    """The current CONSUMER span of one attempt of ``job`` (a ClaimedJob),
    the child of the span that enqueued it. The executor enters it only
    when ``active()``."""
    with _tracer.start_as_current_span(
        f"process {job.queue_name}",
        context=_context_of(job.traceparent),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.destination.name": job.queue_name,
            "messaging.message.id": str(job.id),
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "shardq.task": job.task_path,
            "shardq.shard": job.shard,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


# Outcome.status -> shardq.outcome (the metrics' words).
_OUTCOMES = {"SUCCESSFUL": "succeeded", "READY": "retried", "FAILED": "failed"}


def attempt_ended(span: Any, job: Any, outcome: Any) -> None:
    """The attempt's number and outcome on its span (``outcome``: the
    executor's Outcome, or None when it wrote none: see ``note_outcome``)."""
    if not span.is_recording():
        return
    span.set_attribute("shardq.attempt", job.attempts)
    if outcome is not None:
        word = "timed_out" if outcome.extra.get("timed_out") else _OUTCOMES.get(outcome.status, outcome.status)
        span.set_attribute("shardq.outcome", word)


def note_outcome(word: str) -> None:
    """The outcome of the current attempt when the executor writes no
    Outcome (committed by the task, fence lost, handed back, timed out)."""
    span = _trace.get_current_span()
    if span.is_recording():
        span.set_attribute("shardq.outcome", word)


def record_attempt_error(task: Any, job: Any, error: BaseException) -> None:
    """An attempt's error on the current span (the attempt's)."""
    span = _trace.get_current_span()
    if span.is_recording():
        try:
            args, kwargs = job.args, job.kwargs
        except ValueError:
            args, kwargs = [], {}
        record_error(span, task, args, kwargs, error)


# -- errors and sensitive values ------------------------------------------------------


def record_error(span: Any, task: Any, args: Any, kwargs: Any, error: BaseException) -> None:
    """``error`` as the span's ``exception`` event and ERROR status, with
    every value of an argument ``task`` marks sensitive redacted."""
    if not span.is_recording():
        return
    secrets = sensitive_texts(task, args, kwargs)
    path = _class_path(error)
    message = _redact(str(error), secrets)[:MAX_ERROR_CHARS]
    stack = _redact("".join(traceback.format_exception(error)), secrets)[-MAX_ERROR_CHARS:]
    span.add_event(
        "exception",
        {"exception.type": path, "exception.message": message, "exception.stacktrace": stack},
    )
    span.set_status(Status(StatusCode.ERROR, f"{path}: {message}"[:MAX_ERROR_CHARS]))


def sensitive_texts(task: Any, args: Any, kwargs: Any) -> list[str]:
    """The texts a sensitive argument's value may appear as in an error
    (``str``, ``repr`` and JSON of each value and of what it contains),
    longest first. Every argument when ``sensitive=True``, when ``task`` is
    None, or when the call does not fit the function."""
    # No task (shardq's own error before it was resolved): its sensitivity
    # is unknown, so every value is treated as sensitive, as the admin does.
    names = True if task is None else getattr(task, "sensitive", ())
    if not names:
        return []
    args = args if isinstance(args, (list, tuple)) else [args]
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    values: list[Any]
    if names is True:
        values = [*args, *kwargs.values()]
    else:
        values = _named_values(task, args, kwargs, frozenset(names))
    texts: set[str] = set()
    for value in values:
        _texts_of(value, texts)
    return sorted((t for t in texts if t), key=len, reverse=True)


def _named_values(task: Any, args: Sequence[Any], kwargs: dict, names: frozenset) -> list[Any]:
    func = getattr(task, "func", None)
    try:
        signature = inspect.signature(func)  # type: ignore[arg-type]
        if getattr(task, "takes_context", False):
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [*args, *kwargs.values()]  # does not fit: every value is treated as sensitive
    values: list[Any] = []
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            values.extend(v for k, v in value.items() if k in names or name in names)
        elif name in names:
            values.append(value)
    return values


def _texts_of(value: Any, texts: set[str]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _texts_of(item, texts)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _texts_of(item, texts)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        texts.update((str(value), repr(value)))
    else:
        texts.add(repr(value))
    try:
        texts.add(json.dumps(value))
    except (TypeError, ValueError):
        pass


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def _class_path(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"
