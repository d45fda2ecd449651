"""From a call of a task to the parameters of its row: the task's own
(``task_params``, the same for every call) and the call's (``job_row``:
its arguments as JSON, its shard key and hash, its limit keys)."""

import json
import random

from django.tasks.exceptions import InvalidTask

from ..conf import Config
from ..core.hashing import salted_key_hash, shard_key_hash
from ..core.limits import LimitSpec
from ..fairness import call_fair_key
from ..fairness import queue_fair_keys as queue_fair_keys_setting
from ..limits import call_limits, static_keys
from ..tasks import ShardTask, bind_arguments, check_text, compute_shard_key
from .arguments import dump_arguments, dump_keyword_arguments


class JobRows:
    """Builds the rows of one backend's jobs (``alias``: the backend's, stored
    in the row; ``queue_limits``: SHARDQ["QUEUES"]' limits)."""

    def __init__(
        self,
        alias: str,
        config: Config,
        queue_limits: dict[str, LimitSpec],
        queue_fair_keys: dict[str, str] | None = None,
    ) -> None:
        self.alias = alias
        self.config = config
        self.queue_limits = queue_limits
        # SHARDQ["QUEUES"][name]["fair_key"]: the argument a queue's jobs
        # are shared by, for tasks with no fair_key of their own.
        self.queue_fair_keys = queue_fair_keys if queue_fair_keys is not None else queue_fair_keys_setting()

    def job_row(self, task, args, kwargs) -> dict:
        """Validate one call and build its row (raises InvalidTask, stores nothing)."""
        bind_arguments(task, args, kwargs)
        args_json = dump_arguments(task, args, kwargs)
        kwargs_json = dump_keyword_arguments(task, kwargs)
        size = len(args_json) + len(kwargs_json)
        if size > self.config.max_payload_bytes:
            raise InvalidTask(
                f"{task.module_path}: the arguments are {size} bytes of JSON, over "
                f"SHARDQ['MAX_PAYLOAD_BYTES'] = {self.config.max_payload_bytes}. Store large "
                "data elsewhere (a model, a file) and pass its id."
            )
        key = compute_shard_key(task, args, kwargs)  # checked text (tasks.key_to_str)
        if key is None:
            key_hash = random.getrandbits(32) - 2**31
        else:
            try:
                if isinstance(task, ShardTask) and task.salt:
                    # A hot key: one of its sub-keys at random (the row keeps the key).
                    key_hash = salted_key_hash(key, random.randrange(task.salt))
                else:
                    key_hash = shard_key_hash(key)
            except UnicodeEncodeError:  # key_to_str refuses these; a key set some other way
                check_text(key, f"{task.module_path}: the shard key")
                raise
        # No shard here: the statement that writes the row computes it from
        # the cluster's current shard count (shardq_cluster), which an online
        # reshard changes (the insert statements, or reserve_job_ids for COPY).
        row = {
            "key_hash": key_hash,
            "shard_key": key,
            "args": args_json,
            "kwargs": kwargs_json,
        }
        if getattr(task, "limit_by", None) is not None:
            # A partitioned limit: its key depends on this call's value, and
            # one partitioned by the shard key is kept by the key's owner.
            keys, row["key_limited"] = call_limits(task, args, kwargs, key, self.queue_limits)
            row["limit_keys"] = None if keys is None else json.dumps(keys)
        if self.queue_fair_keys or getattr(task, "fair_key", None) is not None:
            # A fair key per call (an argument's value); a fixed one
            # (.using(fair_key=...)) is the task's, in task_params.
            row["fair_key"] = call_fair_key(task, args, kwargs, self.queue_fair_keys)
        return row

    def task_params(self, task) -> dict:
        """The parameters every call of ``task`` shares."""
        is_shard_task = isinstance(task, ShardTask)
        static = static_keys(task, self.queue_limits)
        return {
            "task_path": task.module_path,
            "backend": self.alias,
            "queue_name": task.queue_name,
            # Django's check lets a whole-number float or a bool through
            # (1.0, True); the column is a smallint.
            "priority": int(task.priority),
            "run_after": task.run_after,
            "ordered": is_shard_task and task.ordered,
            "max_attempts": task.max_attempts if is_shard_task else 1,
            "channel": self.config.channel,
            "notify": self.config.notify,
            # Only when the cluster row is missing (shard_count_now).
            "shard_count": self.config.shard_count,
            # The limits every call of the task counts against (docs/limits.md);
            # job_row replaces it for a task limited per argument value.
            "limit_keys": None if static is None else json.dumps(static),
            "key_limited": False,
            # The enqueue span's W3C context (shardq/tracing.py), set per call.
            "traceparent": None,
            # docs/fairness.md: a key set with .using(fair_key=...) (job_row
            # sets a key computed per call) and the job's own weight.
            "fair_key": getattr(task, "fair_key_value", None),
            "fair_weight": getattr(task, "fair_weight", None),
            # The task's tags (or .using(tags=...)'s) as a JSON array; NULL
            # without any, so the job stays out of shardq_job_tags_idx.
            "tags": json.dumps(list(task.tags)) if getattr(task, "tags", None) else None,
        }
