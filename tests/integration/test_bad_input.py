"""Bad input gets a clear InvalidTask and stores nothing."""

import datetime
import decimal
import uuid

import pytest
from django.tasks import TaskContext
from django.tasks.exceptions import InvalidTask
from django.utils import timezone

import shardq
from shardq import exponential, shard_task
from shardq.exceptions import ArgumentNotJSON
from tests.helpers import sql
from tests.taskapp import tasks
from tests.taskapp.tasks import add, echo, keyed

from .conftest import job_count

pytestmark = pytest.mark.django_db


def two_arguments(user_id: int, note: str) -> None:
    """A module-level function the tests decorate on the spot."""


def takes_context(context: TaskContext, user_id: int) -> None:
    """A module-level function with a context argument."""


@shard_task(key=lambda args, kwargs: {"not": object()})
def keyed_by_callable(user_id: int, note: str) -> None:
    """Its key callable returns something that is not JSON."""


@pytest.fixture
def nothing_stored():
    before = job_count()
    yield
    assert job_count() == before, "a refused enqueue stored a job"


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, b"bytes", datetime.date(2026, 1, 1), decimal.Decimal("1.5"), uuid.uuid4()],
    ids=["object", "set", "bytes", "date", "decimal", "uuid"],
)
def test_a_positional_argument_that_is_not_json_is_refused_by_position(value, nothing_stored):
    with pytest.raises(InvalidTask, match=r"tests\.taskapp\.tasks\.add: positional argument 1 is not JSON"):
        add.enqueue(1, value)


def test_a_keyword_argument_that_is_not_json_is_refused_by_name(nothing_stored):
    with pytest.raises(InvalidTask, match=r"keyword argument 'b' is not JSON \(object"):
        add.enqueue(a=1, b=object())


def test_the_refusal_says_that_shardq_never_pickles(nothing_stored):
    with pytest.raises(InvalidTask, match="never pickles"):
        echo.enqueue([1, {"deep": object()}])


def test_a_value_nested_deep_in_an_argument_is_found(nothing_stored):
    with pytest.raises(InvalidTask, match=r"keyword argument 'payload' at \['rows'\]\[1\]\[1\] is not JSON \(set"):
        echo.enqueue(payload={"rows": [[1, 2], [3, {4, 5}]]})


def test_the_refusal_names_the_place_inside_a_nested_argument(nothing_stored):
    items = [{"when": "today"}, {}, [], {"what": "x", "when": datetime.datetime(2026, 1, 1)}]

    with pytest.raises(InvalidTask) as raised:
        echo.enqueue(items=items)

    assert str(raised.value).startswith(
        "tests.taskapp.tasks.echo: keyword argument 'items' at [3]['when'] is not JSON "
        "(datetime: Object of type datetime is not JSON serializable)."
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_not_json(value, nothing_stored):
    with pytest.raises(InvalidTask, match="positional argument 0 is not JSON"):
        add.enqueue(value, 1)
    with pytest.raises(InvalidTask, match=r"keyword argument 'b' at \[0\] is not JSON"):
        add.enqueue(1, b=[value])


def test_a_nul_character_is_refused_because_jsonb_cannot_hold_it(nothing_stored):
    with pytest.raises(InvalidTask, match="NUL character"):
        echo.enqueue("a\x00b")
    with pytest.raises(InvalidTask, match="NUL character"):
        echo.enqueue(text="a\x00b")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({(1, 2): "tuple key"}, r"positional argument 0 has the dict key \(1, 2\) \(tuple\)"),
        ({1: "one"}, r'positional argument 0 has the dict key 1 \(int\).*would get the key "1" instead'),
        ([{"rows": {None: 0}}], r"positional argument 0 at \[0\]\['rows'\] has the dict key None"),
        ({"ok": {1.5: 0}}, r"at \['ok'\] has the dict key 1.5 \(float\).*the key \"1.5\""),
        ({True: 0}, r'the dict key True \(bool\).*the key "true"'),
    ],
)
def test_a_non_string_dict_key_is_refused(value, message, nothing_stored):
    # json.dumps would turn the key 1 into "1" and the task would get a different dict.
    with pytest.raises(ArgumentNotJSON, match=message):
        echo.enqueue(value)
    with pytest.raises(ArgumentNotJSON, match=message.replace("positional argument 0", "keyword argument 'text'")):
        echo.enqueue(text=value)
    with pytest.raises(ArgumentNotJSON, match=message):
        shardq.enqueue_many(echo, [((value,), {})])


def test_string_keys_and_braces_in_strings_are_stored_as_given():
    value = {"a": [{"b": 1}], "{": "}{"}
    assert echo.enqueue(value).args == [value]
    assert echo.enqueue(text="{1: 2}").kwargs == {"text": "{1: 2}"}


@pytest.mark.parametrize("priority", [101, -101, 1000])
def test_a_priority_out_of_range_is_refused(priority, nothing_stored):
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        add.using(priority=priority)
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        shard_task(priority=priority)(two_arguments)


@pytest.mark.parametrize("priority", [100, -100])
def test_the_priority_bounds_are_accepted(priority):
    assert add.using(priority=priority).enqueue(1, 2).task.priority == priority


@pytest.mark.parametrize("priority", [True, 1.0, -100.0, 7.0])
def test_a_priority_djangos_check_lets_through_is_stored_as_its_whole_number(priority):
    # BaseTaskBackend.validate_task accepts any value with int(p) == p.
    result = add.using(priority=priority).enqueue(1, 2)
    assert add.get_result(result.id).task.priority == int(priority)
    [bulk] = shardq.enqueue_many(add.using(priority=priority), [((1, 2), {})])
    assert add.get_result(bulk.id).task.priority == int(priority)


def test_a_naive_run_after_is_refused():
    with pytest.raises(InvalidTask, match="aware datetime"):
        add.using(run_after=datetime.datetime(2030, 1, 1))


def test_a_payload_over_the_limit_is_refused(shardq_settings):
    with shardq_settings(MAX_PAYLOAD_BYTES=200):
        echo.enqueue("x" * 150)  # under the limit: stored
        before = job_count()
        with pytest.raises(InvalidTask, match=r"over SHARDQ\['MAX_PAYLOAD_BYTES'\] = 200"):
            echo.enqueue("x" * 120, text="y" * 120)
        with pytest.raises(InvalidTask, match="MAX_PAYLOAD_BYTES"):
            import shardq

            shardq.enqueue_many(echo, [(("small",), {}), (("x" * 300,), {})])
        assert job_count() == before


def test_the_default_payload_limit_is_one_mebibyte(nothing_stored):
    with pytest.raises(InvalidTask, match=r"1048576"):
        echo.enqueue("x" * (1024 * 1024))


def test_a_key_that_names_no_argument_fails_at_definition():
    expected = r"key='account_id' is not an argument of the function \(its arguments: user_id, note\)"
    with pytest.raises(InvalidTask, match=expected):
        shard_task(key="account_id")(two_arguments)


def test_the_context_argument_cannot_be_the_key():
    with pytest.raises(InvalidTask, match="key='context' is not an argument"):
        shard_task(key="context", takes_context=True)(takes_context)


def test_a_key_that_is_neither_a_name_nor_a_callable_fails_at_definition():
    with pytest.raises(InvalidTask, match="key must be an argument name or a callable"):
        shard_task(key=42)(two_arguments)


@pytest.mark.parametrize("max_attempts", [0, -1, 1.5, True, "3"])
def test_max_attempts_below_one_or_not_an_int_fails_at_definition(max_attempts):
    with pytest.raises(InvalidTask, match="max_attempts must be an int >= 1"):
        shard_task(max_attempts=max_attempts)(two_arguments)


def test_a_backoff_not_built_by_exponential_fails_at_definition():
    with pytest.raises(InvalidTask, match=r"backoff must come from shardq\.exponential"):
        shard_task(backoff=lambda attempt: 1)(two_arguments)
    assert shard_task(max_attempts=3, backoff=exponential())(two_arguments).max_attempts == 3


def test_a_function_that_is_not_module_level_fails_at_definition():
    with pytest.raises(InvalidTask, match="module level"):

        @shard_task(key="user_id")
        def nested(user_id: int) -> None:  # pragma: no cover - never defined
            pass


def test_a_task_that_takes_context_without_a_context_argument_fails_at_definition():
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        shard_task(takes_context=True)(two_arguments)


def test_a_call_that_does_not_bind_to_the_keyed_function_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match="arguments do not match"):
        keyed.enqueue(note="no user id")


def test_a_shard_key_that_is_not_json_is_refused(nothing_stored):
    with pytest.raises(InvalidTask, match=r"The shard key .* is not JSON"):
        keyed_by_callable.enqueue(user_id=1, note="x")


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00Z", 300, 1.5], ids=["str", "int", "float"])
def test_a_run_after_that_is_not_a_datetime_is_refused_with_what_to_pass(value, nothing_stored):
    with pytest.raises(
        InvalidTask, match=r"run_after must be an aware datetime, e\.g\. .*timezone\.now\(\) \+ timedelta"
    ):
        tasks.noop.using(run_after=value).enqueue()


def test_a_run_after_timedelta_is_a_delay_from_now():
    before = timezone.now()
    result = tasks.noop.using(run_after=datetime.timedelta(minutes=5)).enqueue()
    [(run_after,)] = sql("SELECT run_after FROM shardq_job WHERE id = %s", [int(result.id)])
    assert before + datetime.timedelta(minutes=5) <= run_after <= timezone.now() + datetime.timedelta(minutes=5)
    assert result.task.run_after == run_after
