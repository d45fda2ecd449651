"""``shardq.metrics``, the path docs/operations.md gives a web process for
``metrics_view``. The metrics themselves are the worker's
(``shardq/worker/metrics.py``)."""

from .worker.metrics import Metrics, metrics_view

__all__ = ["Metrics", "metrics_view"]
