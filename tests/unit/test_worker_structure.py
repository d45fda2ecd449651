"""The worker's wiring (issue 24, DESIGN §5): one pipeline object, data one way.

Read from the code and from a constructed ``Worker`` (nothing is started, no
connection is opened): no stage holds an earlier stage, only the pipeline
object and its config; constructors stay small because every service takes
the one frozen config.
"""

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import shardq.worker
from shardq.worker.buffer import Buffer
from shardq.worker.completer import Completer
from shardq.worker.executor import Executor
from shardq.worker.fetcher import Fetcher
from shardq.worker.listener import Listener
from shardq.worker.pipeline import PipelineConfig, WorkerOptions
from shardq.worker.runtime import Worker
from shardq.worker.starter import StartWrites

WORKER_DIR = Path(shardq.worker.__file__).parent

# The stages in the order data moves through them. The start write is the
# executor's own first step (StartWrites: no thread, no queue), a part of
# it: it must hold nothing earlier either.
STAGES = (Listener, Fetcher, Buffer, StartWrites, Executor, Completer)
PART_OF = {StartWrites: Executor}


def inits() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(WORKER_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        found.append((f"{path.name}:{node.name}", item))
    return found


def parameters(init: ast.FunctionDef) -> int:
    """Parameters a caller can pass (``self`` not counted)."""
    args = init.args
    return len(args.posonlyargs) + len(args.args) - 1 + len(args.kwonlyargs) + bool(args.vararg) + bool(args.kwarg)


def test_no_constructor_in_the_worker_takes_more_than_eight_parameters():
    assert inits(), "no __init__ found: the walk is broken"
    wide = {name: parameters(init) for name, init in inits() if parameters(init) > 8}
    assert wide == {}


def test_the_worker_constructor_is_at_most_sixty_lines():
    source = inspect.getsource(Worker.__init__)
    assert len(source.splitlines()) <= 60


def test_the_pipeline_config_is_frozen_and_validated():
    config = PipelineConfig.build(WorkerOptions(concurrency=3), "w")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.worker_id = "other"  # type: ignore[misc]
    with pytest.raises(Exception, match="concurrency = 0"):
        PipelineConfig.build(WorkerOptions(concurrency=0), "w")


def references(obj: object) -> list[tuple[str, object]]:
    """What ``obj`` holds: its attributes, and the objects its bound methods are bound to."""
    values = vars(obj) if hasattr(obj, "__dict__") else {s: getattr(obj, s, None) for s in obj.__slots__}
    held = []
    for name, value in values.items():
        held.append((name, value))
        bound = getattr(value, "__self__", None)
        if bound is not None:
            held.append((f"{name}.__self__", bound))
    return held


@pytest.mark.django_db
def test_no_stage_holds_a_reference_to_an_earlier_stage():
    worker = Worker(WorkerOptions(concurrency=2))
    try:
        stages = {
            Listener: worker.listener,
            Fetcher: worker.fetcher,
            Buffer: worker.pipeline.buffer,
            StartWrites: worker.executor.starts,
            Executor: worker.executor,
            Completer: worker.completer,
        }
        assert all(stage is not None for stage in stages.values())
        backwards = []
        for position, kind in enumerate(STAGES):
            earlier = STAGES[:position]
            for name, value in references(stages[kind]):
                if isinstance(value, earlier) and PART_OF.get(type(value)) is not kind:
                    backwards.append(f"{kind.__name__}.{name} -> {type(value).__name__}")
        assert backwards == []
    finally:
        for store in worker.store.values():
            store.close()


def test_the_structure_test_sees_a_backward_reference():
    class Probe:
        def __init__(self, fetcher):
            self.fetcher = fetcher
            self.wake = fetcher.wake

    fetcher = object.__new__(Fetcher)
    found = [name for name, value in references(Probe(fetcher)) if isinstance(value, Fetcher)]
    assert found == ["fetcher", "wake.__self__"]
