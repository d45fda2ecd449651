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
        (
            ["--processes", "abc"],
            "--processes must be a whole number from 1 to 256 or 'auto' (one per core), not 'abc'.",
        ),
        (["--grace", "soon"], "--grace must be a number of seconds"),
        (["--grace", "-1"], "--grace must be a number of seconds"),
        (["--queues", "default,nope"], "unknown queue(s) nope"),
        (["--prefetch", "x"], "--prefetch must be a whole number"),
        (["--max-tasks", "0"], "--max-tasks must be a whole number from 1 to 1000000000"),
        (["--max-tasks", "10000000000"], "--max-tasks must be a whole number from 1 to 1000000000"),
        (["--max-tasks", "few"], "--max-tasks must be a whole number"),
        (["--worker-id", ""], "--worker-id must be 1 to 100 printable characters"),
        (["--worker-id", "x" * 101], "--worker-id must be 1 to 100 printable characters"),
        (["--worker-id", "web\x1b[2J"], "--worker-id must be 1 to 100 printable characters"),
        (["--worker-id", "a\nb"], "--worker-id must be 1 to 100 printable characters"),
        (["--backend", "nope"], "--backend 'nope' names no backend in TASKS"),
        (["--queues", "default", "--exclude-queues", "emails"], "--queues and --exclude-queues cannot be used"),
        (["--exclude-queues", "nope"], "--exclude-queues names unknown queue(s) nope"),
        (["--queues", ""], "--queues '' names no queue"),
        (["--queues", " , ,"], "--queues ' , ,' names no queue"),
        (["--exclude-queues", ","], "--exclude-queues ',' names no queue"),
        (["--exclude-queues", "default,emails,reports"], "--exclude-queues leaves no queue to serve"),
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


def test_backend_must_name_a_shardq_backend():
    tasks = {
        "default": {"BACKEND": "shardq.backend.ShardqBackend"},
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
    with override_settings(TASKS=tasks), pytest.raises(CommandError, match="not a shardq backend"):
        call_command("shardq_worker", "--backend", "immediate")


def test_backend_names_the_alias_whose_queues_are_checked():
    tasks = {
        "default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["default"]},
        "bulk": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": ["imports"]},
    }
    with override_settings(TASKS=tasks):
        with pytest.raises(CommandError, match=r"unknown queue\(s\) default; .* \(TASKS\['bulk'\]\['QUEUES'\]\)"):
            call_command("shardq_worker", "--backend", "bulk", "--queues", "default")
        with pytest.raises(CommandError, match="--concurrency must be"):
            call_command("shardq_worker", "--backend", "bulk", "--queues", "imports", "--concurrency", "0")


def test_an_empty_queues_setting_lets_the_worker_exclude_any_queue_name():
    tasks = {"default": {"BACKEND": "shardq.backend.ShardqBackend", "QUEUES": []}}
    with override_settings(TASKS=tasks), pytest.raises(CommandError, match="--concurrency must be"):
        call_command("shardq_worker", "--exclude-queues", "anything", "--concurrency", "0")
