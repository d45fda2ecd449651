"""OpenTelemetry traces (issue 28 §1, shardq/tracing.py): a span for each
enqueue and each attempt, the attempt a child of the enqueuing trace through
the traceparent stored with the job, read back from the SDK's in-memory
exporter. The worker runs in this process (tests/helpers.py
``in_process_worker``) on the test database."""

import importlib
import json
import sys

import pytest
from django.test import Client
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import shardq
from shardq import Workflow, tracing
from tests.helpers import in_process_worker, job_row, wait_until
from tests.taskapp import tasks as t
from tests.taskapp import tracing_tasks

pytestmark = pytest.mark.django_db(transaction=True)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    """The finished spans of this test (the SDK is this process's tracer
    provider from the first such test on: OpenTelemetry sets it once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def finished(spans, kind, job_id=None):
    return [
        s
        for s in spans.get_finished_spans()
        if s.kind == kind and (job_id is None or s.attributes.get("messaging.message.id") == str(job_id))
    ]


def w3c(span):
    """The W3C traceparent header naming ``span``."""
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"


def done(job_id):
    row = job_row(job_id)
    return row is not None and row["status"] in ("SUCCESSFUL", "FAILED")


def test_a_view_s_request_enqueue_and_attempt_are_one_trace(spans):
    request_tracer = trace.get_tracer("a web framework's instrumentation")
    with request_tracer.start_as_current_span("POST /add/", kind=SpanKind.SERVER) as request:
        response = Client().post("/add/", {"a": 2, "b": 3}, content_type="application/json")
    assert response.status_code == 201
    job_id = response.json()["job"]
    with in_process_worker(concurrency=1):
        wait_until(lambda: done(job_id) and finished(spans, SpanKind.CONSUMER, job_id), timeout=30)
    [send] = finished(spans, SpanKind.PRODUCER, job_id)
    [attempt] = finished(spans, SpanKind.CONSUMER, job_id)
    trace_id = request.get_span_context().trace_id
    # request -> send -> process, one trace.
    assert send.context.trace_id == attempt.context.trace_id == trace_id
    assert send.parent.span_id == request.get_span_context().span_id
    assert attempt.parent.span_id == send.context.span_id
    assert job_row(job_id)["traceparent"] == w3c(send)
    assert send.name == "send reports" and attempt.name == "process reports"
    assert dict(send.attributes) == {
        "messaging.system": "shardq",
        "messaging.destination.name": "reports",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": str(job_id),
        "shardq.task": "example_project.demo.tasks.add",
    }
    assert dict(attempt.attributes) == {
        "messaging.system": "shardq",
        "messaging.destination.name": "reports",
        "messaging.message.id": str(job_id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "shardq.task": "example_project.demo.tasks.add",
        "shardq.shard": job_row(job_id)["shard"],
        "shardq.attempt": 1,
        "shardq.outcome": "succeeded",
    }
    assert attempt.status.status_code is StatusCode.UNSET


def test_a_retry_is_two_attempt_spans_in_one_trace_each_a_child_of_the_enqueue(spans):
    result = tracing_tasks.fails_once.enqueue()
    with in_process_worker(concurrency=1):
        wait_until(lambda: done(result.id) and len(finished(spans, SpanKind.CONSUMER, result.id)) == 2, timeout=30)
    [send] = finished(spans, SpanKind.PRODUCER, result.id)
    first, second = sorted(finished(spans, SpanKind.CONSUMER, result.id), key=lambda s: s.start_time)
    assert {first.context.trace_id, second.context.trace_id} == {send.context.trace_id}
    assert first.parent.span_id == second.parent.span_id == send.context.span_id
    assert (first.attributes["shardq.attempt"], first.attributes["shardq.outcome"]) == (1, "retried")
    assert (second.attributes["shardq.attempt"], second.attributes["shardq.outcome"]) == (2, "succeeded")
    # The failed attempt's error is on its span.
    assert first.status.status_code is StatusCode.ERROR
    [event] = first.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "builtins.RuntimeError"
    assert event.attributes["exception.message"] == "attempt 1 fails on purpose"
    assert second.status.status_code is StatusCode.UNSET and not second.events


def test_a_sensitive_argument_is_in_no_span_even_in_its_task_s_error(spans):
    result = tracing_tasks.sign_in.enqueue("ada", password="hunter2-secret")
    with in_process_worker(concurrency=1):
        wait_until(lambda: done(result.id) and finished(spans, SpanKind.CONSUMER, result.id), timeout=30)
    [attempt] = finished(spans, SpanKind.CONSUMER, result.id)
    assert attempt.attributes["shardq.outcome"] == "failed"
    assert attempt.status.status_code is StatusCode.ERROR
    [event] = attempt.events
    assert event.attributes["exception.type"] == "builtins.PermissionError"
    # Redacted in the span, as in the job's own stored error (which every
    # viewer of the job in the admin sees).
    assert event.attributes["exception.message"] == "no account 'ada' with the password [redacted]"
    assert "hunter2-secret" not in json.dumps(job_row(result.id)["errors"])
    assert "[redacted]" in json.dumps(job_row(result.id)["errors"])
    every_span = json.dumps(
        [
            [dict(s.attributes), [dict(e.attributes) for e in s.events], s.status.description]
            for s in spans.get_finished_spans()
        ]
    )
    assert "hunter2-secret" not in every_span
    assert "ada" in every_span  # an argument not marked sensitive may show in an error


def test_a_workflow_step_s_span_links_to_its_parents_and_its_attempt_is_its_child(spans):
    earlier = t.noop.enqueue()
    wf = Workflow(name="traced")
    # Tasks that use no database connection of their own: the in-process
    # worker's executor threads would leave theirs open.
    first = wf.add(t.noop)
    second = wf.add(t.add, 1, 2)
    last = wf.add(t.echo, after=[first, second, earlier])
    results = wf.enqueue()
    assert last.result.id == results[2].id
    with in_process_worker(concurrency=2):
        wait_until(lambda: all(done(r.id) for r in [earlier, *results]), timeout=30)
        wait_until(lambda: finished(spans, SpanKind.CONSUMER, results[2].id), timeout=30)
    sends = {r.id: finished(spans, SpanKind.PRODUCER, r.id)[0] for r in [earlier, *results]}
    [graph] = [s for s in spans.get_finished_spans() if s.name == "send workflow"]
    assert graph.attributes["shardq.workflow"] == "traced"
    assert all(sends[r.id].parent.span_id == graph.context.span_id for r in results)
    parents = [first.result, second.result, earlier]
    linked = {link.context.span_id for link in sends[last.result.id].links}
    assert linked == {sends[p.id].context.span_id for p in parents}
    assert all(link.context.trace_id == graph.context.trace_id for link in sends[last.result.id].links[:2])
    [attempt] = finished(spans, SpanKind.CONSUMER, last.result.id)
    assert attempt.parent.span_id == sends[last.result.id].context.span_id


def test_enqueue_many_stores_its_one_span_s_context_in_every_row(spans):
    results = shardq.enqueue_many(t.noop, [((), {}) for _ in range(3)])
    [send] = finished(spans, SpanKind.PRODUCER)
    assert send.attributes["messaging.batch.message_count"] == 3
    assert [job_row(r.id)["traceparent"] for r in results] == [w3c(send)] * 3


def test_without_opentelemetry_api_tracing_is_off_and_jobs_store_no_context(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    try:
        importlib.reload(tracing)
        assert tracing.enabled is False
        result = t.noop.enqueue()
        assert job_row(result.id)["traceparent"] is None
        with in_process_worker(concurrency=1):
            wait_until(lambda: done(result.id), timeout=30)
        assert job_row(result.id)["status"] == "SUCCESSFUL"
    finally:
        monkeypatch.undo()
        importlib.reload(tracing)
    assert tracing.enabled is True


def test_with_the_api_and_no_sdk_no_span_is_made_and_an_upstream_context_is_stored(spans, monkeypatch):
    # As in a process that never set a tracer provider up: the API's global is None.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    assert tracing.enabled and not tracing.active()
    plain = t.noop.enqueue()
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # an incoming request's header
    token = otel_context.attach(TraceContextTextMapPropagator().extract({"traceparent": upstream}))
    try:
        carried = t.noop.enqueue()
        [many] = shardq.enqueue_many(t.noop, [((), {})])
    finally:
        otel_context.detach(token)
    with in_process_worker(concurrency=1):
        wait_until(lambda: all(done(r.id) for r in (plain, carried, many)), timeout=30)
    assert spans.get_finished_spans() == ()
    assert [job_row(r.id)["traceparent"] for r in (plain, carried, many)] == [None, upstream, upstream]
