"""Redaction: arguments a task marks ``sensitive`` are shown as
``"[redacted]"`` on every admin page."""

import json
from collections.abc import Sequence
from typing import Any

from django.tasks import Task

from .keys import signature_of

REDACTED = "[redacted]"


def _sensitive_names(task: Task) -> frozenset | bool:
    """True (every argument), or the names marked sensitive (maybe none)."""
    value = getattr(task, "sensitive", ())
    if value is True:
        return True
    return frozenset(value or ())


def redact_arguments(task: Task | None, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """A job's stored ``args`` and ``kwargs`` as an operator may see them.

    The values of the arguments ``task`` marks sensitive become
    ``"[redacted]"``; positional ones are named through the function's
    signature (the context parameter of ``takes_context`` tasks is not
    stored), extra positional or keyword values through the ``*args`` /
    ``**kwargs`` parameter's name. ``task=None`` (a task path this process
    cannot resolve: its sensitivity is unknown) redacts every value, as does
    a stored shape that does not fit the function.
    """
    names = True if task is None else _sensitive_names(task)
    if names is True:
        return (
            [REDACTED] * len(args) if isinstance(args, list) else REDACTED,
            {k: REDACTED for k in kwargs} if isinstance(kwargs, dict) else REDACTED,
        )
    if not names:
        return args, kwargs
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return REDACTED, REDACTED
    params = list(signature_of(task).parameters.values())
    if task is not None and task.takes_context and params:  # not None: names would be True
        params = params[1:]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_positional = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    var_keyword = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    keyword = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    shown_args = []
    for i, value in enumerate(args):
        # An extra positional value with no *args to take it does not fit the
        # function: hidden rather than guessed at.
        arg = positional[i] if i < len(positional) else var_positional
        shown_args.append(REDACTED if arg is None or arg in names else value)
    shown_kwargs = {
        k: REDACTED if (k in names or (k not in keyword and (var_keyword is None or var_keyword in names))) else v
        for k, v in kwargs.items()
    }
    return shown_args, shown_kwargs


def shard_key_is_sensitive(task: Task | None) -> bool:
    """Whether a job's stored shard key may reveal a sensitive argument: the
    task marks every argument sensitive, its ``key`` names a sensitive
    argument, or ``key`` is a callable (it may read any argument) and some
    argument is sensitive. Unknown tasks (None): yes."""
    if task is None:
        return True
    names = _sensitive_names(task)
    if not names:
        return False
    key = getattr(task, "key", None)
    if names is True:
        return True
    return callable(key) or key in names


def sensitive_values(task: Task | None, args: Any, kwargs: Any) -> list[str]:
    """The values of a call's sensitive arguments as they may appear in a
    message (``str``, ``repr`` and JSON forms), longest first: what
    ``redact_text`` hides. None, bools and empty values are left out (too
    common to hide, nothing to tell)."""
    if task is None:
        return []
    shown_args, shown_kwargs = redact_arguments(task, args, kwargs)
    hidden: list[Any] = []
    if isinstance(args, list):
        if isinstance(shown_args, list):
            hidden += [value for value, shown in zip(args, shown_args, strict=False) if shown == REDACTED]
        else:
            hidden += args
    if isinstance(kwargs, dict):
        if isinstance(shown_kwargs, dict):
            hidden += [value for key, value in kwargs.items() if shown_kwargs.get(key) == REDACTED]
        else:
            hidden += list(kwargs.values())
    forms: set[str] = set()
    for value in hidden:
        if value is None or isinstance(value, bool) or value in ("", [], {}):
            continue
        forms.add(str(value))
        forms.add(repr(value))
        try:
            forms.add(json.dumps(value))
        except (TypeError, ValueError):
            pass
    return sorted((form for form in forms if form), key=len, reverse=True)


def redact_text(text: str, values: Sequence[str]) -> str:
    """``text`` with every occurrence of ``values`` replaced by ``[redacted]``."""
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    return text
