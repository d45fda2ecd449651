"""Skip sending a Django signal when sending it can have no effect.

Django's task signals each have one receiver of Django's own
(``log_task_started`` and friends), which logs to the ``django.tasks``
logger. Sending the signal costs a ``TaskResult`` and, through that
receiver, a ``LogRecord``: about half of a no-op job's CPU in a worker. So
the worker and the backend send a signal only when something can observe it:

* a receiver other than Django's own logging receiver is connected, or
* a record of that level logged to ``django.tasks`` would reach something:
  the logger is enabled for the level *and* a handler on its propagation
  chain would emit it (or a filter would see it, or logging's last resort).

The second test is what Django's default logging needs. With no ``LOGGING``
setting ``django.tasks`` is enabled at INFO, yet both handlers of the
``django`` logger drop an INFO record unless ``DEBUG``: ``console`` has a
``RequireDebugTrue`` filter and ``mail_admins`` is ERROR-level. A failure's
ERROR record does reach ``mail_admins`` (``RequireDebugFalse``), so failures
are still sent.

The handler verdict walks the chain (about 2 µs), so it is cached per level
and taken again when that is cheap to notice: the logger becomes enabled for
the level (``setLevel``, ``caplog.at_level``), ``DEBUG`` or ``LOGGING``
changes (``setting_changed``, e.g. ``override_settings``), and otherwise at
least every ``RECHECK_SECONDS``. A handler added or removed at run time is
therefore seen within a second; whatever the project configures before the
worker starts (``LOGGING``, a receiver connected at import) is seen from the
first job. Receivers are compared on every call (a list comparison).
"""

import logging
import time
import weakref

from django.utils.log import RequireDebugFalse, RequireDebugTrue

# The handler verdicts are taken again at least this often.
RECHECK_SECONDS = 1.0

# Bumped when a setting the verdicts depend on changes (settings_changed).
_generation = 0


def settings_changed(*, setting: str, **kwargs: object) -> None:
    """``setting_changed`` receiver (connected in ``apps.ready``): DEBUG decides
    what Django's filters let through."""
    global _generation
    if setting in ("DEBUG", "LOGGING"):
        _generation += 1


def _debug() -> bool:
    from django.conf import settings

    return bool(settings.DEBUG)


def _handler_sees(handler: logging.Handler) -> bool:
    """Would ``handler`` emit (or a filter of it see) a record it is handed?

    False only where the outcome is known without a record: a NullHandler,
    or Django's RequireDebugTrue/RequireDebugFalse refusing it before any
    other filter runs. Anything else (another filter, a handler with its own
    ``handle`` or ``filter``) counts as seeing it.
    """
    kind = type(handler)
    if kind.handle is logging.NullHandler.handle:
        return False
    if kind.handle is not logging.Handler.handle or kind.filter is not logging.Filterer.filter:
        return True
    for record_filter in handler.filters:
        filter_kind = type(record_filter)
        if filter_kind is RequireDebugTrue:
            if not _debug():
                return False
        elif filter_kind is RequireDebugFalse:
            if _debug():
                return False
        else:
            return True
    return True


def record_is_seen(logger: logging.Logger, level: int) -> bool:
    """Would a record of ``level`` logged to ``logger`` reach anything?

    Mirrors ``Logger.handle`` and ``Logger.callHandlers``: a disabled or
    quiet logger drops it; the logger's own filters see it; then every
    handler up the propagation chain whose level it meets; with no handler
    at all, logging's last resort (or its one-time "no handlers" warning).
    """
    if not logger.isEnabledFor(level):
        return False
    if logger.filters:
        return True
    found = 0
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if getattr(handler, "captures_job_logs", False):
                # Per-job logs' handler (worker/joblogs.py) keeps only a task's
                # own records, never these signals' (sent outside an attempt),
                # and passes on to the last resort what logging would have.
                continue
            found += 1
            if level >= handler.level and _handler_sees(handler):
                return True
        current = current.parent if current.propagate else None
    if found:
        return False
    if logging.lastResort is not None:
        return level >= logging.lastResort.level
    return logging.raiseExceptions and not logger.manager.emittedNoHandlerWarning


class LogVerdicts:
    """``record_is_seen`` for one logger, cached per level (see the module
    docstring for when it is taken again)."""

    def __init__(self, logger: logging.Logger, clock=time.monotonic) -> None:
        self.logger = logger
        self.clock = clock
        self._verdicts: dict[int, bool] = {}
        self._generation = _generation
        self._until = 0.0

    def seen(self, level: int) -> bool:
        if not self.logger.isEnabledFor(level):
            # Taken again once the logger is enabled for the level.
            self._verdicts.pop(level, None)
            return False
        now = self.clock()
        if now >= self._until or self._generation != _generation:
            self._verdicts.clear()
            self._generation = _generation
            self._until = now + RECHECK_SECONDS
        verdict = self._verdicts.get(level)
        if verdict is None:
            verdict = self._verdicts[level] = record_is_seen(self.logger, level)
        return verdict


class SignalGate:
    """Does sending ``signal`` have any effect?

    True when a receiver other than Django's own logging receiver is
    connected, or when that receiver's record would be seen
    (``record_is_seen`` on the ``django.tasks`` logger, cached by
    ``LogVerdicts``; gates of one caller can share theirs). The receiver
    list is compared on every call.
    """

    def __init__(self, signal, own_receiver, verdicts: LogVerdicts | None = None):
        self.signal = signal
        self.own_receiver = own_receiver
        self.verdicts = verdicts or LogVerdicts(logging.getLogger("django.tasks"))
        self._seen: list | None = None
        self._others = True

    def other_receivers(self) -> bool:
        """Is a receiver other than Django's own logging receiver connected?"""
        receivers = self.signal.receivers
        # The same tuples as last time (an identity check each): nothing
        # connected or disconnected since.
        if receivers != self._seen:
            self._seen = list(receivers)
            live = []
            for entry in receivers:
                ref = entry[1]
                target = ref() if isinstance(ref, weakref.ReferenceType) else ref
                if target is not None:
                    live.append(target)
            self._others = any(target is not self.own_receiver for target in live)
        return self._others

    def needed(self, level: int) -> bool:
        return self.other_receivers() or self.verdicts.seen(level)
