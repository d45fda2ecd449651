"""tests.settings with the history settings of a bench (bench/history.py,
bench/soak_history.py) from the environment: SHARDQ_BENCH_HISTORY_DAYS,
_GRACE, _PARTITION (each optional)."""

import os

from tests.settings import *  # noqa: F403

SHARDQ = {**SHARDQ, "HISTORY_GRACE": 60.0}  # noqa: F405  (the default; tests.settings keeps an hour)
for _key, _cast in (("DAYS", float), ("GRACE", float), ("PARTITION", int)):
    if os.environ.get(f"SHARDQ_BENCH_HISTORY_{_key}"):
        SHARDQ[f"HISTORY_{_key}"] = _cast(os.environ[f"SHARDQ_BENCH_HISTORY_{_key}"])
