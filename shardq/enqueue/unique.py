"""Unique tasks (``unique_for=``): their own branch of enqueue, so the plain
path stays as it is.

* ``enqueue`` runs ``insert_unique_job`` (prepared as ``insert_job`` is):
  one statement takes the key in ``shardq_unique`` and inserts the job only
  when it got the key; otherwise it returns the holder's id, and
  ``get_result`` reads the holder (a second statement: the holder may have
  committed after the first statement's snapshot). The key row is written
  in the caller's transaction, so the key is taken exactly when the job
  exists; a second enqueue of the key in another transaction waits for that
  one to commit or roll back.
* A process-local LRU (``OPTIONS["UNIQUE_CACHE_SIZE"]``) remembers recently
  seen keys: key -> (local monotonic deadline, the holder's ``TaskResult``).
  A duplicate found there before its deadline is answered without a query,
  with a copy of the holder's result as this process last saw it (status
  READY after its own insert; ``refresh()`` reads the table). Two rules keep
  the cache from ever refusing an enqueue the database would accept:
  an entry is added only for committed knowledge (the holder the database
  named, or this process's own insert, both through ``on_commit`` of the
  database alias: immediately in autocommit, at COMMIT inside ``atomic()``,
  never after a rollback), and its deadline is the database's remaining TTL
  counted from when the statement was *sent*, minus
  ``UNIQUE_CACHE_MARGIN_SECONDS`` (clock rate differences); a key with less
  left than that is not cached. Deleting a job frees its key in the database
  at the next enqueue of that key (``release_unique_key``), but a process
  that cached the key answers with the deleted job until its deadline.
"""

import threading
import time
from collections.abc import Callable
from functools import partial

from django.db import connections, transaction
from django.tasks import TaskResult
from django.tasks.exceptions import TaskResultDoesNotExist

from ..core.lru import make_lru
from ..db import enqueue as enqueue_statements
from ..db import operations
from ..tasks import compute_unique_key
from .results import copy_result

# Default of OPTIONS["UNIQUE_CACHE_SIZE"]: recently seen unique keys kept (0: none).
UNIQUE_KEYS_CACHED = 1024
# A cached unique key is trusted until this long before the database's expiry
# (counted from when the statement was sent): room for the local monotonic
# clock and the database's clock to run at slightly different rates.
UNIQUE_CACHE_MARGIN_SECONDS = 1.0


def unique_cache_size(options) -> int:
    """``OPTIONS["UNIQUE_CACHE_SIZE"]``, or the default when it is not an int >= 0
    (the check shardq.E007 reports that)."""
    size = options.get("UNIQUE_CACHE_SIZE", UNIQUE_KEYS_CACHED)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        return size
    return UNIQUE_KEYS_CACHED


class UniqueJobs:
    """One backend's unique enqueues and its cache of keys (None: off).

    ``get_result`` reads a holder's result by id; ``new_result`` builds the
    READY result of a job just inserted (the backend's own two)."""

    def __init__(
        self,
        database_alias: str,
        prepared_statements: bool,
        cache_size: int,
        get_result: Callable[[str], TaskResult],
        new_result: Callable[..., TaskResult],
    ) -> None:
        self.database_alias = database_alias
        self.prepared_statements = prepared_statements
        self.get_result = get_result
        self.new_result = new_result
        # Unique key -> (monotonic deadline, holder's TaskResult), committed
        # knowledge only (see the module docstring). The lock guards it: an
        # LRU is not thread-safe, and even a get reorders.
        self.cache = make_lru(cache_size) if cache_size else None
        self._lock = threading.Lock()

    def enqueue(self, task, args, kwargs, params: dict) -> tuple[TaskResult, bool]:
        """One call (``params``: its row's, already validated, so bad input is
        refused even for a duplicate): (the holder's result when the key is
        taken, from the cache or the database, else the new job's; whether a
        job was inserted)."""
        unique_key = compute_unique_key(task, args, kwargs)
        cached = self.cached(unique_key)
        if cached is not None:
            return cached, False
        return self._insert(task, args, kwargs, params, unique_key)

    def enqueue_many(
        self, task, calls: list[tuple[tuple, dict]], row_of: Callable[[tuple, dict], dict]
    ) -> tuple[list[TaskResult], list[TaskResult]]:
        """Many calls, every one validated first (``row_of(args, kwargs)``:
        its row's params) and its key computed, then the unique path once per
        distinct key in one atomic block; a call whose key an earlier call of
        the batch had gets a copy of that result. Returns (a result per call,
        the results of the jobs inserted)."""
        keyed = []
        for args, kwargs in calls:
            params = row_of(args, kwargs)
            keyed.append((args, kwargs, params, compute_unique_key(task, args, kwargs)))
        results = []
        inserted_results = []
        by_key: dict[str, TaskResult] = {}
        with transaction.atomic(using=self.database_alias):
            for args, kwargs, params, unique_key in keyed:
                first = by_key.get(unique_key)
                if first is not None:
                    results.append(copy_result(first))
                    continue
                result = self.cached(unique_key)
                if result is None:
                    result, inserted = self._insert(task, args, kwargs, params, unique_key)
                    if inserted:
                        inserted_results.append(result)
                by_key[unique_key] = result
                results.append(result)
        return results, inserted_results

    def _insert(self, task, args, kwargs, params, unique_key) -> tuple[TaskResult, bool]:
        """Run insert_unique_job; return (result, whether a job was inserted)."""
        params["unique_key"] = unique_key
        params["unique_for"] = task.unique_for_seconds
        for attempt in range(2):
            sent = time.monotonic()
            job_id, inserted, remaining, enqueued_at, run_after, _ = enqueue_statements.fetch_one(
                self.database_alias, "insert_unique_job", params, prepared=self.prepared_statements
            )
            if inserted:
                result = self.new_result(task, job_id, enqueued_at, run_after, args, kwargs)
                break
            try:
                result = self.get_result(str(job_id))
                break
            except TaskResultDoesNotExist:
                # The holder committed (the statement saw it or waited for
                # it), so a holder this later statement cannot see was
                # deleted inside the TTL: free the key and take it (once).
                if attempt:
                    raise
                operations.run(
                    "release_unique_key",
                    {"unique_key": unique_key, "job_id": job_id},
                    using=self.database_alias,
                    fetch="none",
                )
        if self.cache is not None:
            deadline = sent + remaining - UNIQUE_CACHE_MARGIN_SECONDS
            if deadline > time.monotonic():
                conn = connections[self.database_alias]
                if conn.in_atomic_block:
                    # Learnt inside the caller's transaction: cached only once
                    # it commits (the key row may be this transaction's own
                    # write, and a rollback would free the key).
                    transaction.on_commit(
                        partial(self._remember, unique_key, deadline, copy_result(result)),
                        using=self.database_alias,
                    )
                elif conn.get_autocommit():  # the statement has committed
                    self._remember(unique_key, deadline, copy_result(result))
                # Manual transactions (set_autocommit(False)) give no hook to
                # learn of the commit: not cached.
        return result, inserted

    def _remember(self, unique_key, deadline, result) -> None:
        if deadline <= time.monotonic():  # the commit came too late to be worth it
            return
        with self._lock:
            assert self.cache is not None  # only called when the cache is on
            self.cache.set(unique_key, (deadline, result))

    def cached(self, unique_key) -> TaskResult | None:
        """A copy of the cached holder's result, or None (not cached, or past its deadline)."""
        if self.cache is None:
            return None
        with self._lock:
            entry = self.cache.get(unique_key)
            if entry is None:
                return None
            deadline, result = entry
            if deadline <= time.monotonic():
                self.cache.pop(unique_key)
                return None
        return copy_result(result)
