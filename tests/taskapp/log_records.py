"""Counts the log records a process creates for the ``django.tasks`` logger.

A worker started with ``SHARDQ_TEST_COUNT_LOG_RECORDS=1`` installs it at
start (``TaskAppConfig.ready``); the ``log_records`` task returns the counts,
so a test can tell whether the worker built records nobody sees. It wraps
the record factory only: which handlers emit a record does not change.
"""

import logging
import threading
from collections import Counter

_counts: Counter = Counter()
_lock = threading.Lock()


def install() -> None:
    previous = logging.getLogRecordFactory()

    def counting_factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if record.name == "django.tasks":
            with _lock:
                _counts[record.levelname] += 1
                if record.exc_info:
                    _counts["with exc_info"] += 1
        return record

    logging.setLogRecordFactory(counting_factory)


def counts() -> dict[str, int]:
    with _lock:
        return dict(_counts)
