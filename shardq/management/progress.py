"""Progress bars for the commands: rich's when ``shardq[rich]`` is installed,
else a plain-text stand-in with the part of its API the commands use.

The stand-in writes a line to stderr at most every ``interval`` seconds and
once at the end (``pruning jobs: 5000/20000``), so a log or cron mail shows
progress without a terminal.
"""

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Self, TextIO

__all__ = ["HAS_RICH", "BarColumn", "MofNCompleteColumn", "Progress", "TextColumn", "TimeRemainingColumn"]

try:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    HAS_RICH = True
except ImportError:
    HAS_RICH = False

    class _Column:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.args = args

        def render(self, task: "_Task") -> str:
            return ""

    class TextColumn(_Column):  # type: ignore[no-redef]
        def render(self, task: "_Task") -> str:
            return str(self.args[0]).format(task=task) if self.args else ""

    class BarColumn(_Column):  # type: ignore[no-redef]
        pass

    class MofNCompleteColumn(_Column):  # type: ignore[no-redef]
        pass

    class TimeRemainingColumn(_Column):  # type: ignore[no-redef]
        pass

    @dataclass
    class _Task:
        description: str
        total: float | None
        completed: float = 0
        printed_at: float = field(default=0.0)

    class Progress:  # type: ignore[no-redef]
        """Plain-text progress: ``text: completed/total`` lines on stderr."""

        def __init__(
            self,
            *columns: Any,
            transient: bool = False,
            disable: bool = False,
            file: TextIO | None = None,
            interval: float = 2.0,
            **_: Any,
        ) -> None:
            self.columns = columns
            self.disable = disable
            self.file = file or sys.stderr
            self.interval = interval
            self.tasks: list[_Task] = []

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            for task_id in range(len(self.tasks)):
                self._print(task_id)

        def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
            self.tasks.append(_Task(description, total, printed_at=time.monotonic()))
            return len(self.tasks) - 1

        def advance(self, task_id: int, advance: float = 1) -> None:
            self.update(task_id, advance=advance)

        def update(
            self,
            task_id: int,
            *,
            total: float | None = None,
            completed: float | None = None,
            advance: float | None = None,
            description: str | None = None,
            **_: Any,
        ) -> None:
            task = self.tasks[task_id]
            if total is not None:
                task.total = total
            if completed is not None:
                task.completed = completed
            if advance is not None:
                task.completed += advance
            if description is not None:
                task.description = description
            if time.monotonic() - task.printed_at >= self.interval:
                self._print(task_id)

        def _print(self, task_id: int) -> None:
            if self.disable:
                return
            task = self.tasks[task_id]
            task.printed_at = time.monotonic()
            label = " ".join(filter(None, (c.render(task) for c in self.columns if isinstance(c, _Column))))
            done = f"{task.completed:g}" + (f"/{task.total:g}" if task.total is not None else "")
            self.file.write(f"{label or task.description}: {done}\n")
            self.file.flush()
