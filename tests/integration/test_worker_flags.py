"""``shardq_worker`` validates its flags before starting anything."""

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be a whole number"),
        (["--concurrency", "many"], "--concurrency must be a whole number"),
        (["--processes", "-2"], "--processes must be a whole number"),
        (["--grace", "soon"], "--grace must be a number of seconds"),
        (["--grace", "-1"], "--grace must be a number of seconds"),
        (["--queues", "default,nope"], "unknown queue(s) nope"),
        (["--prefetch", "x"], "--prefetch must be a whole number"),
    ],
)
def test_bad_worker_flags_raise_a_command_error_naming_the_flag(flags, message):
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("shardq_worker", *flags)


def test_an_empty_queues_setting_lets_the_worker_serve_any_queue_name():
    # TASKS[...]["QUEUES"] = [] means "any queue name" to Django's backend
    # (BaseTaskBackend.validate_task), so --queues may name any queue. The
    # bad --concurrency that follows shows the queues passed validation
    # without a worker being started.
    tasks = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks), pytest.raises(CommandError, match="--concurrency must be"):
        call_command("shardq_worker", "--queues", "default,anything", "--concurrency", "0")
