"""Test helpers for application code: run enqueued jobs inside a test, and
assert what was enqueued (docs/testing.md).

```python
from django.test import TestCase
from shardq.testing import assert_enqueued, drain

class ReceiptTests(TestCase):
    def test_an_order_sends_its_receipt(self):
        self.client.post("/orders/", {"customer_id": 7, "total_cents": 1200}, content_type="application/json")
        assert_enqueued(send_receipt, kwargs={"customer_id": 7, "order_id": 1})
        report = drain()
        assert report.failed == []
```

Nothing here imports pytest; the pytest fixture ``shardq_drain`` lives in
``shardq.testing.pytest_plugin``, which pytest loads through its entry point.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import EnqueuedJob, assert_enqueued, assert_not_enqueued, enqueued
    from .draining import DEFAULT_MAX_JOBS, WORKER_ID, DrainLimitExceeded, DrainReport, RanJob, adrain, drain

__all__ = [
    "DEFAULT_MAX_JOBS",
    "WORKER_ID",
    "DrainLimitExceeded",
    "DrainReport",
    "EnqueuedJob",
    "RanJob",
    "adrain",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued",
]

# Loaded on first use: pytest imports this package (for the plugin) before
# Django is configured, and the helpers import Django and shardq's worker.
_ASSERTIONS = {"EnqueuedJob", "assert_enqueued", "assert_not_enqueued", "enqueued"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'shardq.testing' has no attribute {name!r}")
    module = import_module(".assertions" if name in _ASSERTIONS else ".draining", __name__)
    value = getattr(module, name)
    globals()[name] = value
    return value
