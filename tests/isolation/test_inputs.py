"""Bad input at enqueue (issue 10): every one is an ``InvalidTask`` that names
the argument and says what to do, and stores nothing -- never a DataError, a
RecursionError, a crash of the process, or a TypeError in the worker."""

import asyncio
import datetime
import hashlib
import subprocess
import sys

import pytest
from django.core.checks import Error
from django.tasks.exceptions import InvalidTask

import shardq
from shardq.backend import MAX_ARGUMENT_DEPTH
from shardq.db.store import connect, listen_statement
from shardq.exceptions import ArgumentNotJSON
from shardq.tasks import compute_unique_key
from tests.helpers import job_row, wait_until
from tests.integration.conftest import (
    execute,
    job_count,
    reset_task_backends,
    shardq_settings,  # noqa: F401 (a fixture)
)
from tests.taskapp.tasks import add, echo, flaky, keyed, unique_per_account, unique_report

pytestmark = pytest.mark.django_db

SURROGATE = "\ud800"  # what json.loads('"\\ud800"') gives: a str with no UTF-8 form


def unique_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shardq_unique")
        return cursor.fetchone()[0]


@pytest.fixture
def nothing_stored():
    before = job_count(), unique_count()
    yield
    assert (job_count(), unique_count()) == before, "a refused enqueue stored a row"


@shardq.shard_task(key=lambda args, kwargs: f"{kwargs['n']}{SURROGATE if kwargs['n'] else ''}")
def keyed_by_callable(n: int) -> int:
    """Its key callable makes a key with a lone surrogate for n != 0."""
    return n


def nested(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


# -- lone surrogates ---------------------------------------------------------------


@pytest.mark.process
def test_hashing_a_lone_surrogate_raises_instead_of_crashing_the_process():
    # In a child process: before the fix mmh3 segfaulted on this str.
    code = (
        "from shardq.core.hashing import shard_key_hash, salted_key_hash, murmur3_32, fnv1a_32, key_slot\n"
        "for f in (shard_key_hash, murmur3_32, fnv1a_32, key_slot, lambda k: salted_key_hash(k, 1)):\n"
        "    try:\n"
        "        f('a\\ud800')\n"
        "    except UnicodeEncodeError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit('hashed')\n"
        "print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "refused"), done.stderr


def test_strict_utf8_hashing_keeps_every_existing_hash():
    import mmh3

    from shardq.core.hashing import hashtag, shard_key_hash

    for key in ("hello", "user:{42}", "é", "日本", "😀", ""):
        assert shard_key_hash(key) == mmh3.hash(hashtag(key)) == mmh3.hash(hashtag(key).encode())


def test_a_lone_surrogate_in_an_explicit_shard_key_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match=r"shard key shard_key holds a lone surrogate"):
        keyed.using(shard_key="user:" + SURROGATE).enqueue(user_id=1)


def test_a_lone_surrogate_in_the_key_argument_is_refused_by_name(nothing_stored):
    with pytest.raises(InvalidTask, match=r"keyed: keyword argument 'user_id' holds a lone surrogate"):
        keyed.enqueue(user_id=SURROGATE)
    with pytest.raises(InvalidTask, match=r"keyed: positional argument 0 holds a lone surrogate"):
        keyed.enqueue(SURROGATE)


def test_a_lone_surrogate_from_a_key_callable_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match=r"shard key returned by key=<lambda> holds a lone surrogate"):
        keyed_by_callable.enqueue(n=1)
    with pytest.raises(InvalidTask, match=r"shard key returned by key=<lambda> holds a lone surrogate"):
        shardq.enqueue_many(keyed_by_callable, [((), {"n": 0}), ((), {"n": 1})])


def test_a_lone_surrogate_in_an_argument_is_refused_by_name(nothing_stored):
    with pytest.raises(InvalidTask, match=r"add: positional argument 1 holds a lone surrogate"):
        add.enqueue(1, SURROGATE)
    with pytest.raises(InvalidTask, match=r"keyword argument 'b' holds a lone surrogate"):
        add.enqueue(a=1, b="x" + SURROGATE)


def test_a_lone_surrogate_deep_in_an_argument_is_refused_with_its_path(nothing_stored):
    with pytest.raises(InvalidTask, match=r"keyword argument 'payload' at \['rows'\]\[1\]\[0\] holds a lone surrogate"):
        echo.enqueue(payload={"rows": [["fine"], [SURROGATE]]})


def test_a_lone_surrogate_in_a_dict_key_is_refused(nothing_stored):
    with pytest.raises(
        InvalidTask, match=r"a dict key in keyword argument 'payload' at \['a'\] holds a lone surrogate"
    ):
        echo.enqueue(payload={"a": {SURROGATE: 1}})
    with pytest.raises(InvalidTask, match=r"a dict key in positional argument 0 holds a lone surrogate"):
        echo.enqueue({SURROGATE: 1})


def test_a_lone_surrogate_is_refused_by_enqueue_many_and_nothing_is_stored(nothing_stored):
    with pytest.raises(InvalidTask, match=r"positional argument 1 holds a lone surrogate"):
        shardq.enqueue_many(add, [((1, 2), {}), ((1, SURROGATE), {})])


def test_a_lone_surrogate_is_refused_by_aenqueue(nothing_stored):
    with pytest.raises(InvalidTask, match=r"positional argument 1 holds a lone surrogate"):
        asyncio.run(add.aenqueue(1, SURROGATE))


def test_a_lone_surrogate_is_refused_for_a_unique_task(nothing_stored):
    with pytest.raises(InvalidTask, match=r"unique_report: keyword argument 'kind' holds a lone surrogate"):
        unique_report.enqueue(1, kind=SURROGATE)


# -- NUL characters ----------------------------------------------------------------


def test_a_nul_in_an_explicit_shard_key_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match=r"shard key shard_key holds a NUL character"):
        keyed.using(shard_key="a\x00b").enqueue(user_id=1)


def test_a_nul_in_a_dict_key_of_an_argument_is_refused_by_name(nothing_stored):
    with pytest.raises(InvalidTask, match=r"a dict key in keyword argument 'payload' at \[0\] holds a NUL character"):
        echo.enqueue(payload=[{"a\x00": 1}])


def test_a_nul_in_an_argument_is_refused_by_enqueue_many(nothing_stored):
    with pytest.raises(InvalidTask, match=r"keyword argument 'b' holds a NUL character"):
        shardq.enqueue_many(add, [((), {"a": 1, "b": 2}), ((), {"a": 1, "b": "\x00"})])


def test_a_backslash_u0000_text_is_not_a_nul():
    # The six characters \u0000 are ordinary text, stored as they are.
    result = echo.enqueue("\\u0000")
    assert job_row(result.id)["args"] == ["\\u0000"]


# -- sizes and depth ----------------------------------------------------------------


@pytest.fixture
def any_queue():
    """The default backend without a QUEUES list: every queue name is allowed
    by Django, so only shardq's own limits apply."""
    from django.conf import settings
    from django.test import override_settings

    tasks = {**settings.TASKS, "default": {**settings.TASKS["default"], "QUEUES": []}}
    try:
        with override_settings(TASKS=tasks):
            reset_task_backends()
            yield
    finally:
        reset_task_backends()


def test_a_queue_name_over_100_characters_is_refused(any_queue, nothing_stored):
    with pytest.raises(InvalidTask, match=r"queue_name is 101 characters, over the 100"):
        add.using(queue_name="q" * 101).enqueue(1, 2)
    add.using(queue_name="q" * 100).enqueue(1, 2)  # the limit itself is fine
    execute("DELETE FROM shardq_job WHERE queue_name = %s", ["q" * 100])


def test_a_queue_name_with_a_nul_is_refused(any_queue, nothing_stored):
    with pytest.raises(InvalidTask, match=r"queue_name holds a NUL character"):
        add.using(queue_name="q\x00").enqueue(1, 2)


def test_an_argument_nested_5000_deep_is_refused_by_name(nothing_stored):
    with pytest.raises(InvalidTask, match=rf"keyword argument 'tree' is nested more than {MAX_ARGUMENT_DEPTH}"):
        echo.enqueue(tree=nested(5000))
    with pytest.raises(InvalidTask, match=rf"positional argument 0 is nested more than {MAX_ARGUMENT_DEPTH}"):
        echo.enqueue({"a": nested(5000)})
    with pytest.raises(InvalidTask, match=r"nested more than"):
        shardq.enqueue_many(echo, [((), {}), ((nested(5000),), {})])


def test_an_argument_at_the_depth_limit_is_stored():
    result = echo.enqueue(nested(MAX_ARGUMENT_DEPTH - 1))
    assert job_row(result.id)["args"] == [nested(MAX_ARGUMENT_DEPTH - 1)]


def test_a_self_containing_argument_is_refused_not_looped_over(nothing_stored):
    loop = []
    loop.append(loop)
    with pytest.raises(InvalidTask, match=r"positional argument 0 is nested more than"):
        echo.enqueue(loop)


# -- arguments bound against the signature ----------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ((1,), {}, "missing a required argument: 'b'"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1, 2), {"c": 3}, "got an unexpected keyword argument 'c'"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
    ],
    ids=["too-few", "too-many", "unknown-keyword", "twice"],
)
def test_a_plain_task_call_that_does_not_fit_the_function_is_refused(args, kwargs, problem, nothing_stored):
    with pytest.raises(InvalidTask, match=rf"add: the arguments do not match add\(a: int, b: int\).*{problem}"):
        add.enqueue(*args, **kwargs)


def test_a_shard_task_without_a_key_binds_its_arguments(nothing_stored):
    with pytest.raises(InvalidTask, match=r"flaky: the arguments do not match .*missing a required argument: 'tag'"):
        flaky.enqueue(1)
    with pytest.raises(InvalidTask, match=r"unexpected keyword argument 'colour'"):
        flaky.enqueue(1, "t", colour="red")


def test_enqueue_many_binds_every_call(nothing_stored):
    with pytest.raises(InvalidTask, match=r"add: the arguments do not match .*too many positional arguments"):
        shardq.enqueue_many(add, [((1, 2), {}), ((1, 2, 3), {})])
    with pytest.raises(InvalidTask, match=r"unexpected keyword argument 'x'"):
        shardq.enqueue_many(unique_report, [((1,), {}), ((1,), {"x": 1})])


def test_aenqueue_binds_the_arguments(nothing_stored):
    with pytest.raises(InvalidTask, match=r"add: the arguments do not match"):
        asyncio.run(add.aenqueue(1))


# -- JSON, and Django's TypeError ---------------------------------------------------


def test_a_datetime_argument_is_both_a_type_error_and_invalid_task(nothing_stored):
    moment = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable") as raised:
        add.enqueue(1, moment)
    assert isinstance(raised.value, InvalidTask) and isinstance(raised.value, ArgumentNotJSON)
    assert "positional argument 1 is not JSON" in str(raised.value)
    with pytest.raises(TypeError, match="Object of type datetime is not JSON serializable"):
        shardq.enqueue_many(add, [((1,), {"b": moment})])


# -- unique keys ---------------------------------------------------------------------


def test_a_short_unique_value_cannot_take_the_key_of_a_hashed_long_one():
    long_value = "a" * 600  # over UNIQUE_KEY_MAX_BYTES: the key stores a SHA-256
    forged = "sha256:" + hashlib.sha256(long_value.encode()).hexdigest()
    first = unique_per_account.enqueue(forged)
    second = unique_per_account.enqueue(long_value)
    assert first.id != second.id
    assert compute_unique_key(unique_per_account, (forged,), {}) != compute_unique_key(
        unique_per_account, (long_value,), {}
    )
    assert unique_per_account.enqueue(long_value).id == second.id  # still unique


def test_the_hashed_unique_key_marks_itself_after_the_task_path():
    key = compute_unique_key(unique_per_account, ("x" * 600,), {})
    assert key.startswith(unique_per_account.module_path + "#sha256:")


# -- SHARDQ["CHANNEL"] ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("channel", "problem"),
    [
        ("x" * 64, "is 64 bytes of UTF-8, over PostgreSQL's limit of 63"),
        ("é" * 32, "is 64 bytes of UTF-8"),
        ("", "is empty"),
        ("a\x00b", "holds a NUL character"),
        (42, "is a int, not a str"),
    ],
    ids=["64-ascii", "64-bytes-utf8", "empty", "nul", "not-str"],
)
def test_an_unusable_channel_fails_check_e008(channel, problem):
    from django.conf import settings
    from django.test import override_settings

    with override_settings(SHARDQ={**settings.SHARDQ, "CHANNEL": channel}):
        messages = [m for m in add.get_backend().check() if m.id == "shardq.E008"]
    assert len(messages) == 1 and isinstance(messages[0], Error)
    assert problem in messages[0].msg


@pytest.mark.parametrize("channel", ["x" * 63, 'Shard Q-ü"quoted"', "shardq"])
def test_a_usable_channel_passes_the_check(channel):
    from django.conf import settings
    from django.test import override_settings

    with override_settings(SHARDQ={**settings.SHARDQ, "CHANNEL": channel}):
        assert [m.id for m in add.get_backend().check()] == []


@pytest.mark.django_db(transaction=True)
def test_enqueue_notifies_the_channel_the_worker_listens_on_exactly(shardq_settings):  # noqa: F811
    # pg_notify() takes the channel as a value, LISTEN as a quoted identifier:
    # case, spaces and quotes survive both, so they meet.
    channel = 'Shard Q-ü"x"'
    listener = connect()
    try:
        listener.execute(listen_statement(channel))
        with shardq_settings(CHANNEL=channel):
            result = keyed.enqueue(user_id=7)
        row = job_row(result.id)
        received = []

        def got_it():
            received.extend(listener.notifies(timeout=0.2, stop_after=1))
            return received

        wait_until(got_it, timeout=10)
        assert (received[0].channel, received[0].payload) == (channel, f"{row['shard']}:{row['priority']}")
    finally:
        listener.close()


# -- get_result on rows written by hand -----------------------------------------------------


def test_get_result_reads_odd_rows_written_by_raw_sql():
    result = add.enqueue(1, 2)
    execute(
        "UPDATE shardq_job SET status = 'WEIRD', errors = '{\"not\": \"a list\"}', worker_ids = '\"w\"',"
        " started_at = 'infinity', finished_at = '-infinity', last_attempted_at = '20000-01-01',"
        " run_after = 'infinity' WHERE id = %s",
        [int(result.id)],
    )

    read = add.get_backend().get_result(result.id)

    assert read.status == "FAILED"
    assert [e.exception_class_path for e in read.errors] == ["shardq.exceptions.UnreadableJob"]
    assert "'WEIRD'" in read.errors[0].traceback
    assert read.worker_ids == []
    assert read.started_at.year == 9999 and read.finished_at is None and read.last_attempted_at.year == 9999
    assert read.task.run_after.year == 9999


def test_get_result_reads_error_entries_of_another_shape():
    result = add.enqueue(1, 2)
    execute(
        'UPDATE shardq_job SET status = \'FAILED\', errors = \'[1, {"exception_class_path": "x.Y", '
        "\"traceback\": \"tb\"}]', worker_ids = '[1, \"w\"]', args = '{}', kwargs = '[]',"
        " enqueued_at = '-infinity' WHERE id = %s",
        [int(result.id)],
    )

    read = add.get_backend().get_result(result.id)

    assert [e.exception_class_path for e in read.errors] == ["shardq.exceptions.UnreadableJob", "x.Y"]
    assert read.worker_ids == ["1", "w"]
    assert (read.args, read.kwargs, read.enqueued_at) == ([], {}, None)


def test_get_result_still_shows_a_claimed_job_as_ready():
    result = add.enqueue(1, 2)
    execute("UPDATE shardq_job SET status = 'CLAIMED' WHERE id = %s", [int(result.id)])
    assert add.get_backend().get_result(result.id).status == "READY"


def test_get_result_shows_a_stored_priority_out_of_range():
    result = add.enqueue(1, 2)
    execute("UPDATE shardq_job SET priority = 500, queue_name = 'nowhere' WHERE id = %s", [int(result.id)])
    assert add.get_backend().get_result(result.id).id == result.id


# -- the fast paths agree with the exact checks ----------------------------------------------


def test_the_fast_signature_check_never_accepts_a_call_bind_refuses():
    import inspect
    import itertools

    from shardq.tasks.keys import _Shape

    def f1(a, b=1): ...
    def f2(a, *args, c, d=2, **kw): ...
    def f3(*, x): ...
    def f4(a, /, b): ...
    def f5(context, a, b=2): ...

    calls = [
        (n, kw)
        for n in range(4)
        for kw in ({}, {"a": 1}, {"b": 1}, {"c": 1}, {"x": 1}, {"z": 1}, {"a": 1, "c": 1}, {"b": 1, "c": 1, "d": 1})
    ]
    for func, (count, kwargs) in itertools.product((f1, f2, f3, f4, f5), calls):
        sig = inspect.signature(func)
        try:
            sig.bind(*range(count), **kwargs)
            binds = True
        except TypeError:
            binds = False
        if _Shape.of(sig).fits(count, kwargs):
            assert binds, (func.__name__, count, kwargs)
        elif _Shape.of(sig).simple:
            assert not binds, (func.__name__, count, kwargs)


def test_astral_characters_and_backslashes_are_stored_as_they_are():
    value = {"emoji 😀": ["😀", "\\ud800", "\\u0000", "é"]}
    result = echo.enqueue(value)
    assert job_row(result.id)["args"] == [value]


# -- periodic schedules: the same checks at definition --------------------------------------


def test_a_schedule_whose_arguments_enqueue_would_refuse_fails_at_definition(monkeypatch):
    from shardq import cron
    from shardq.cron import periodic

    monkeypatch.setattr(cron, "_schedules", {})
    with pytest.raises(InvalidTask, match=r"add: the arguments do not match .*missing a required argument"):
        periodic("* * * * *")(add)
    with pytest.raises(InvalidTask, match=r"keyword argument 'b' holds a NUL character"):
        periodic("* * * * *", kwargs={"a": 1, "b": "\x00"})(add)
    assert cron.schedules() == []


def test_a_keyword_argument_name_with_a_nul_or_a_lone_surrogate_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match=r"the name of keyword argument 'a\\x00' holds a NUL character"):
        echo.enqueue(**{"a\x00": 1})
    with pytest.raises(InvalidTask, match=r"the name of keyword argument .* holds a lone surrogate"):
        shardq.enqueue_many(echo, [((), {SURROGATE: 1})])


def test_a_shard_key_set_without_using_is_refused_before_it_is_hashed(nothing_stored):
    from dataclasses import replace

    with pytest.raises(InvalidTask, match=r"keyed: the shard key holds a lone surrogate"):
        replace(keyed, shard_key=SURROGATE).enqueue(user_id=1)
