"""``shardq_worker`` validates its flags before starting anything."""

import pytest
from django.core.management import CommandError, call_command


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
