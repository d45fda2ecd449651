"""Per-job logs' text (shardq/worker/joblogs.py ``AttemptLog``): whatever a
task logs, the attempt's entry is within the bound, marks its cut, hides
sensitive values and is stored by PostgreSQL's jsonb as it is. And the
settings and the task option are validated, naming what is wrong."""

import json

import pytest
from django.db import connection
from django.tasks.exceptions import InvalidTask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardq import shard_task
from shardq.conf import MIN_JOB_LOG_BYTES, job_log_bytes, job_log_level
from shardq.exceptions import ShardqConfigurationError
from shardq.worker.joblogs import AttemptLog
from tests.integration.test_checks import check_ids, shardq_overridden

# Any text: NULs, lone surrogates, astral characters, long runs.
ANY_TEXT = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=3000)


class _Job:
    def __init__(self, args, kwargs):
        self.args, self.kwargs = args, kwargs


def _task(sensitive=()):
    def body(lines: list, secret: str = "") -> None: ...

    body.__module__ = "tests.taskapp.tasks"
    body.__qualname__ = "body"
    return shard_task(sensitive=sensitive)(body)


PLAIN = _task()


@given(lines=st.lists(ANY_TEXT, max_size=8), limit=st.integers(MIN_JOB_LOG_BYTES, 5000))
@settings(max_examples=300, deadline=None)
def test_an_attempts_text_is_valid_utf8_without_nul_within_the_bound_and_its_cut_counted(lines, limit):
    log = AttemptLog(limit, PLAIN, _Job([[]], {}))
    for line in lines:
        log.add(line)
    text = log.close()
    if not lines:
        assert text is None
        return
    assert text is not None
    data = text.encode("utf-8")  # strict: no lone surrogate is left
    assert "\x00" not in text
    assert len(data) <= limit
    stored = "\n".join(lines).replace("\x00", "\\x00").encode("utf-8", "backslashreplace")
    if len(stored) <= limit:
        assert data == stored, "a log within the bound is kept whole"
    else:
        head, mark = text.rsplit("\n… ", 1)
        cut = int(mark.removesuffix(" bytes cut"))
        assert stored.startswith(head.encode("utf-8"))
        assert cut == len(stored) - len(head.encode("utf-8"))


@given(lines=st.lists(ANY_TEXT, min_size=1, max_size=4), attempt=st.integers(1, 1000))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@pytest.mark.django_db
def test_postgresql_stores_every_entry_as_it_is(lines, attempt):
    log = AttemptLog(4096, PLAIN, _Job([[]], {}))
    for line in lines:
        log.add(line)
    entry = log.entry_json(attempt)
    assert entry is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [entry])
        [stored] = cursor.fetchone()
    assert json.loads(stored) == json.loads(entry)


# No character of "[redacted]": the mark cannot spell a value again.
SECRETS = st.text(alphabet="0123456789ABXYZfghklmnopqsuvwxyz-_ é🚀'\"\\", min_size=1, max_size=40)


@given(secret=SECRETS.filter(str.strip), noise=st.text(max_size=50))
@settings(max_examples=200, deadline=None)
def test_a_sensitive_arguments_value_never_appears_in_the_text(secret, noise):
    task = _task(sensitive=("secret",))
    log = AttemptLog(100_000, task, _Job([["x"]], {"secret": secret}))
    log.add(f"{noise} connecting with {secret} ({secret!r}, {json.dumps(secret)}){noise}")
    text = log.close()
    assert text is not None
    assert "[redacted]" in text
    for form in (secret, repr(secret), json.dumps(secret)):
        assert form not in text


def test_nothing_is_added_once_the_attempt_ended():
    log = AttemptLog(1000, PLAIN, _Job([[]], {}))
    log.add("during")
    assert log.close() == "during"
    log.add("after")
    assert log.close() == "during"


@pytest.mark.parametrize("value", ["LOUD", "", None, -1, 2.5, True, ["INFO"]])
def test_a_bad_job_log_level_fails_e014_naming_the_setting(value):
    with pytest.raises(ShardqConfigurationError, match=r"SHARDQ\['JOB_LOG_LEVEL'\]"):
        job_log_level(value)
    with shardq_overridden(JOB_LOG_LEVEL=value):
        assert "shardq.E015" in check_ids()


@pytest.mark.parametrize("value", [-1, 1, MIN_JOB_LOG_BYTES - 1, 1.5e5, "64k", True, None])
def test_a_bad_job_log_bytes_fails_e014_naming_the_setting(value):
    with pytest.raises(ShardqConfigurationError, match=r"SHARDQ\['JOB_LOG_BYTES'\]"):
        job_log_bytes(value)
    with shardq_overridden(JOB_LOG_BYTES=value):
        assert "shardq.E015" in check_ids()


@pytest.mark.parametrize(("level", "bytes_"), [("debug", 0), ("WARNING", MIN_JOB_LOG_BYTES), (15, 1 << 20)])
def test_good_job_log_settings_pass_the_checks(level, bytes_):
    with shardq_overridden(JOB_LOG_LEVEL=level, JOB_LOG_BYTES=bytes_):
        assert "shardq.E015" not in check_ids()


def test_log_must_be_a_bool():
    def body() -> None: ...

    body.__module__ = "tests.taskapp.tasks"
    body.__qualname__ = "body"
    with pytest.raises(InvalidTask, match="log must be True"):
        shard_task(log="no")(body)
