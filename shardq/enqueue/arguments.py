"""What a call must be to become a job (raises ``InvalidTask`` naming what
was wrong): a task's stored names, its ``run_after``, and arguments that are
JSON PostgreSQL can store, found cheaply on the dumped text and walked only
when that text shows a possible problem."""

import json
from datetime import datetime, timedelta

from django.tasks.exceptions import InvalidTask

from ..exceptions import ArgumentNotJSON
from ..tasks import check_text
from ..tasks.keys import _short_repr

# Containers (lists, dicts) nested deeper than this in one argument are
# refused at enqueue: json.dumps and PostgreSQL's jsonb parser recurse, and a
# 5,000-deep value from a request body would end in a RecursionError or a
# "stack depth limit exceeded" DataError.
MAX_ARGUMENT_DEPTH = 100
# Columns of shardq_job (shardq/models.py) a task's definition fills.
MAX_QUEUE_NAME_LENGTH = 100
MAX_TASK_PATH_LENGTH = 300


def check_run_after(task) -> None:
    """Refuse a run_after that is not a datetime with a message that says
    what to pass (Django's own check calls ``utcoffset`` on it: an
    AttributeError for a timedelta, a string or a number)."""
    run_after = task.run_after
    if run_after is None or isinstance(run_after, datetime):
        return
    hint = ""
    if isinstance(run_after, timedelta):
        hint = " A delay is timezone.now() + the timedelta (a @shard_task's .using() also takes the timedelta itself)."
    raise InvalidTask(
        f"{task.module_path}: run_after must be an aware datetime, e.g. "
        f".using(run_after=timezone.now() + timedelta(minutes=5)), not {type(run_after).__name__} "
        f"{_short_repr(run_after)}.{hint}"
    )


def validate_stored_names(task) -> None:
    """Refuse a task whose queue name or path the job table cannot hold
    (raises InvalidTask): checked when the Task is built (``@task``,
    ``.using(queue_name=...)``), so enqueue never meets a DataError."""
    queue_name = task.queue_name
    if not isinstance(queue_name, str) or not queue_name:
        raise InvalidTask(f"{task.module_path}: queue_name must be a non-empty str, not {queue_name!r}.")
    check_text(queue_name, f"{task.module_path}: queue_name")
    if len(queue_name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidTask(
            f"{task.module_path}: queue_name is {len(queue_name)} characters, over the "
            f"{MAX_QUEUE_NAME_LENGTH} that shardq_job.queue_name holds. Use a shorter queue name."
        )
    if len(task.module_path) > MAX_TASK_PATH_LENGTH:
        raise InvalidTask(
            f"The task path {task.module_path[:80]}... is {len(task.module_path)} characters, over "
            f"the {MAX_TASK_PATH_LENGTH} that shardq_job.task_path holds. Use a shorter module or "
            "function name."
        )


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def dump_arguments(task, args, kwargs) -> str:
    """The positional arguments as JSON text (raises InvalidTask naming the bad one)."""
    if not args:
        return "[]"

    def named():
        return [(f"positional argument {position}", value) for position, value in enumerate(args)]

    try:
        text = _dumps(list(args))
    except (TypeError, ValueError, RecursionError):
        _find_bad_argument(task, named)
        raise
    _check_dumped(task, text, named)
    return text


def dump_keyword_arguments(task, kwargs) -> str:
    """The keyword arguments as JSON text (raises InvalidTask naming the bad one)."""
    if not kwargs:
        return "{}"

    def named():
        return [(f"keyword argument {name!r}", value) for name, value in kwargs.items()]

    try:
        text = _dumps(kwargs)
    except (TypeError, ValueError, RecursionError):
        _find_bad_argument(task, named)
        raise
    if "\\u0000" in text or "\\ud" in text:
        for name in kwargs:  # **{"a\x00": 1} is a valid Python call
            check_text(name, f"{task.module_path}: the name of keyword argument {name!r}")
    _check_dumped(task, text, named)
    return text


def _check_dumped(task, text, named) -> None:
    """Cheap tests on the JSON text json.dumps made: it escapes every NUL as
    \\u0000 and every surrogate as \\udXXX, and a value cannot nest deeper
    than its brackets. Only a hit walks the arguments to name the bad one (a
    hit may be a false alarm: a literal backslash, a valid surrogate pair, a
    wide but shallow value)."""
    strings = "\\u0000" in text or "\\ud" in text
    # A dict inside an argument (keyword arguments are one dict themselves):
    # json.dumps writes a key 1, 1.5, True or None as a string, and the task
    # would get {"1": ...} for {1: ...}, so such keys are refused.
    dicts = text.find("{", 1 if text.startswith("{") else 0) != -1
    if strings or dicts or text.count("[") + text.count("{") > MAX_ARGUMENT_DEPTH:
        for what, value in named():
            _check_value(task, what, value, strings=strings, keys=dicts)


def _find_bad_argument(task, named) -> None:
    """Raise InvalidTask for the first bad argument among the (name, value)
    pairs ``named()`` returns (json.dumps refused them); return when none is bad."""
    pairs = named()
    for what, value in pairs:
        _check_value(task, what, value)
    for what, value in pairs:
        _check_json(task, what, value)


_CONTAINERS = (list, tuple, dict)


def _check_value(task, what, value, *, strings=True, keys=True) -> None:
    """Walk one argument without recursion: refuse nesting deeper than
    MAX_ARGUMENT_DEPTH, (``strings``) str values or dict keys, at any
    depth, that PostgreSQL cannot store, and (``keys``) dict keys that are
    not strings (JSON would turn them into strings). Other types are left to
    json.dumps (``_check_json``)."""
    if isinstance(value, str):
        if strings:
            _check_string(task, what, value)
        return
    if not isinstance(value, _CONTAINERS):
        return
    # (container, its depth, its path as a (parent path, step) chain)
    stack: list[tuple[list | tuple | dict, int, tuple | None]] = [(value, 1, None)]
    pop, push = stack.pop, stack.append
    while stack:
        container, depth, path = pop()
        if depth > MAX_ARGUMENT_DEPTH:
            raise InvalidTask(
                f"{task.module_path}: {what} is nested more than {MAX_ARGUMENT_DEPTH} lists or "
                f"dicts deep (at {_path_text(path)}). Pass a flatter value, or store the data "
                "elsewhere (a model, a file) and pass its id."
            )
        if keys and isinstance(container, dict):
            _check_keys(task, what, container, path)
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for step, item in items:
            if strings:
                if isinstance(step, str) and ("\x00" in step or not step.isascii()):
                    _check_string(task, what, step, path, key=True)
                if isinstance(item, str):
                    if "\x00" in item or not item.isascii():
                        _check_string(task, what, item, (path, step))
                    continue
            if isinstance(item, _CONTAINERS):
                push((item, depth + 1, (path, step)))


def _check_keys(task, what, mapping: dict, path) -> None:
    for key in mapping:
        if not isinstance(key, str):
            where = what if path is None else f"{what} at {_path_text(path)}"
            try:
                becomes = f"so the task would get the key {json.dumps({key: 0})[1:-4]} instead"
            except TypeError:
                becomes = "and json cannot write this one at all"
            raise ArgumentNotJSON(
                f"{task.module_path}: {where} has the dict key {key!r} ({type(key).__name__}): JSON object "
                f"keys are strings, {becomes}. Use string keys (str(key)), or pass a list of pairs."
            )


def _check_string(task, what, text, path=None, key=False) -> None:
    if "\x00" not in text and text.isascii():
        return
    where = what
    if path is not None:
        where = f"{what} at {_path_text(path)}"
    if key:
        where = f"a dict key in {where}"
    check_text(text, f"{task.module_path}: {where}")


def _path_text(path) -> str:
    """``path`` (a (parent, step) chain) as Python subscripts: ``['rows'][3]``."""
    steps = []
    while path is not None:
        path, step = path
        steps.append(f"[{step!r}]")
    return "".join(reversed(steps)) or "the top level"


def _first_not_json(value) -> tuple[tuple | None, object]:
    """(the path, the value) of the first value inside ``value`` that JSON
    cannot hold (``value`` itself: path None), walked without recursion."""
    stack: list[tuple[object, tuple | None]] = [(value, None)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _CONTAINERS):
            steps = list(item.items() if isinstance(item, dict) else enumerate(item))
            stack.extend((child, (path, step)) for step, child in reversed(steps))
            continue
        try:
            _dumps(item)
        except (TypeError, ValueError):
            return path, item
    return None, value


def _check_json(task, what, value) -> None:
    try:
        _dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        error: BaseException = exc
        path, bad = _first_not_json(value) if isinstance(value, _CONTAINERS) else (None, value)
        if path is not None:
            # The place inside the argument, as the other checks name it.
            what = f"{what} at {_path_text(path)}"
            try:
                _dumps(bad)
            except (TypeError, ValueError) as inner:
                error = inner
        raise ArgumentNotJSON(
            f"{task.module_path}: {what} is not JSON ({type(bad).__name__}: {error}). "
            "shardq stores arguments as JSON and never pickles: pass ids, strings, numbers, "
            "lists or dicts."
        ) from error
