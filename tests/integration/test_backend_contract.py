"""The backend honours Django's Tasks contract (django.tasks), against real PostgreSQL."""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued
from django.utils import timezone

from shardq import ShardTask, shard_task
from shardq.backend import ShardqBackend
from tests.helpers import job_row
from tests.taskapp.tasks import add, async_add, echo, keyed, noop, whoami

from .conftest import execute

pytestmark = pytest.mark.django_db


@shard_task(key="account_id", takes_context=True, queue_name="emails")
def notify_account(context: TaskContext, account_id: int, text: str) -> str:
    return f"{account_id}:{text}"


def undecorated() -> None:
    """A module-level function the tests decorate on the spot."""


class Received:
    """Collects task_enqueued signals for the duration of a test."""

    def __init__(self):
        self.calls = []

    def __call__(self, sender, **kwargs):
        self.calls.append((sender, kwargs))


@pytest.fixture
def enqueued_signals():
    received = Received()
    task_enqueued.connect(received, weak=False)
    yield received.calls
    task_enqueued.disconnect(received)


def test_backend_declares_every_supported_feature():
    backend = add.get_backend()
    assert type(backend) is ShardqBackend
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_django_task_decorator_builds_shardq_tasks():
    assert isinstance(add, ShardTask)
    assert add.key is None


def test_enqueue_returns_a_ready_task_result_with_every_field_set():
    result = add.enqueue(2, 3)

    assert isinstance(result, TaskResult)
    assert isinstance(result.id, str) and 0 < len(result.id) <= 64
    assert result.task is add
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None and result.enqueued_at.tzinfo is not None
    assert result.started_at is None
    assert result.finished_at is None
    assert result.last_attempted_at is None
    assert result.args == [2, 3]
    assert result.kwargs == {}
    assert result.backend == "default"
    assert result.errors == []
    assert result.worker_ids == []
    assert result.attempts == 0
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        result.return_value


def test_enqueued_row_holds_the_call():
    result = keyed.enqueue(7, note="hello")

    row = job_row(result.id)
    assert row["task_path"] == "tests.taskapp.tasks.keyed"
    assert row["status"] == "READY"
    assert row["queue_name"] == "default"
    assert row["backend"] == "default"
    assert row["priority"] == 10
    assert row["args"] == [7]
    assert row["kwargs"] == {"note": "hello"}
    assert row["shard_key"] == "7"
    assert row["attempts"] == 0 and row["max_attempts"] == 1
    assert row["status_rank"] == 0 and row["fence"] == 0
    assert row["enqueued_at"] == result.enqueued_at
    # Not deferred: run_after is taken at the insert (a clock_timestamp() read
    # just before enqueued_at's), so the job is due at once.
    assert row["run_after"] <= row["enqueued_at"]


def test_get_result_returns_the_same_fields_as_enqueue():
    enqueued = add.enqueue(2, b=3)

    fetched = add.get_backend().get_result(enqueued.id)

    assert fetched.id == enqueued.id
    assert fetched.task == add
    for field in (
        "status",
        "enqueued_at",
        "started_at",
        "finished_at",
        "last_attempted_at",
        "args",
        "kwargs",
        "backend",
        "errors",
        "worker_ids",
    ):
        assert getattr(fetched, field) == getattr(enqueued, field), field


def test_task_get_result_finds_its_own_job_and_refuses_another_tasks():
    result = add.enqueue(1, 1)

    assert add.get_result(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        noop.get_result(result.id)


def test_arguments_round_trip_through_json():
    args = ["text", 1, 2.5, None, True, [1, [2, 3]], {"nested": {"list": [1, "two"]}}]
    kwargs = {"user": {"id": 1, "tags": ["a", "b"]}, "flag": False, "unicode": "žluťoučký 🐎"}

    result = echo.get_backend().get_result(echo.enqueue(*args, **kwargs).id)

    assert result.args == args
    assert result.kwargs == kwargs


def test_tuple_arguments_come_back_as_lists():
    result = add.enqueue((1, 2), b=(3,))

    assert result.args == [[1, 2]]
    assert add.get_backend().get_result(result.id).kwargs == {"b": [3]}


def test_task_enqueued_is_sent_by_the_backend_class_with_the_result(enqueued_signals):
    result = add.enqueue(1, 2)

    assert len(enqueued_signals) == 1
    sender, kwargs = enqueued_signals[0]
    assert sender is ShardqBackend
    assert kwargs["task_result"] is result


def test_task_enqueued_is_sent_once_per_job_of_a_bulk_enqueue(enqueued_signals):
    import shardq

    results = shardq.enqueue_many(add, [((i, i), {}) for i in range(3)])

    assert [kwargs["task_result"] for _, kwargs in enqueued_signals] == results
    assert {sender for sender, _ in enqueued_signals} == {ShardqBackend}


def test_a_task_that_takes_context_stores_only_its_own_arguments():
    result = notify_account.enqueue(5, text="hi")

    row = job_row(result.id)
    assert row["args"] == [5]
    assert row["kwargs"] == {"text": "hi"}
    # The key names the argument after the context: positional 5 is account_id.
    assert row["shard_key"] == "5"
    assert row["queue_name"] == "emails"
    assert whoami.takes_context
    assert job_row(whoami.enqueue().id)["args"] == []


def test_async_task_functions_enqueue_and_resolve_through_the_async_api():
    async def enqueue_and_fetch():
        result = await async_add.aenqueue(2, 3)
        fetched = await async_add.aget_result(result.id)
        return result, fetched

    result, fetched = async_to_sync(enqueue_and_fetch)()

    assert result.status == TaskResultStatus.READY
    assert fetched.id == result.id
    assert fetched.task == async_add
    assert fetched.args == [2, 3]
    assert job_row(result.id)["task_path"] == "tests.taskapp.tasks.async_add"


def test_arefresh_picks_up_a_change_made_in_the_database():
    result = add.enqueue(1, 2)
    execute("UPDATE shardq_job SET status = 'RUNNING', started_at = now() WHERE id = %s", [result.id])

    async_to_sync(result.arefresh)()

    assert result.status == TaskResultStatus.RUNNING


def test_priority_and_run_after_are_stored_in_the_row():
    when = timezone.now() + timedelta(hours=1)

    result = keyed.using(priority=-40, run_after=when).enqueue(user_id=3)

    row = job_row(result.id)
    assert row["priority"] == -40
    assert row["run_after"] == when
    fetched = keyed.get_backend().get_result(result.id)
    assert fetched.task.priority == -40
    assert fetched.task.run_after == when


def test_a_job_that_is_not_deferred_shows_no_run_after():
    fetched = add.get_backend().get_result(add.enqueue(1, 2).id)

    assert fetched.task.run_after is None


def test_a_queue_the_backend_does_not_list_is_refused():
    with pytest.raises(InvalidTask, match=r"has queue_name 'nowhere', which is not in TASKS\['default'\]\['QUEUES'\]"):
        add.using(queue_name="nowhere")

    with pytest.raises(InvalidTask, match="has queue_name 'nowhere', which is not in TASKS"):
        task(queue_name="nowhere")(undecorated)


def test_a_listed_queue_is_stored_with_the_job():
    result = add.using(queue_name="emails").enqueue(1, 2)

    assert job_row(result.id)["queue_name"] == "emails"
    assert add.get_backend().get_result(result.id).task.queue_name == "emails"


def test_an_unknown_id_does_not_exist():
    backend = add.get_backend()

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("987654321098")


@pytest.mark.parametrize("bad_id", ["", "abc", "1.5", "-1", "0x10", "9" * 30, None])
def test_a_malformed_id_does_not_exist(bad_id):
    with pytest.raises(TaskResultDoesNotExist):
        add.get_backend().get_result(bad_id)


@pytest.mark.parametrize(
    "spelling",
    [
        lambda id: f" {id}",
        lambda id: f"{id}\n",
        lambda id: f"0{id}",
        lambda id: f"+{id}",
        lambda id: f"{id[:1]}_{id[1:]}" if len(id) > 1 else f"0_{id}",
        lambda id: "".join(chr(0x0660 + int(d)) for d in id),  # Arabic-Indic digits
    ],
    ids=["leading-space", "trailing-newline", "leading-zero", "plus-sign", "underscore", "arabic-digits"],
)
def test_a_job_answers_only_to_its_canonical_id(spelling):
    # int() accepts every one of these spellings; a result id is one string.
    result = add.enqueue(1, 2)

    with pytest.raises(TaskResultDoesNotExist):
        add.get_backend().get_result(spelling(result.id))
    assert add.get_backend().get_result(result.id).id == result.id


def test_an_unknown_id_does_not_exist_through_the_async_api():
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(add.get_backend().aget_result)("987654321098")


def test_refresh_picks_up_a_status_change_made_in_the_database():
    result = add.enqueue(1, 2)
    execute(
        "UPDATE shardq_job SET status = 'RUNNING', status_rank = 1, attempts = 1,"
        " started_at = clock_timestamp(), last_attempted_at = clock_timestamp(),"
        " worker_ids = '[\"worker-a\"]' WHERE id = %s",
        [result.id],
    )

    result.refresh()

    assert result.status == TaskResultStatus.RUNNING
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.worker_ids == ["worker-a"]
    assert result.attempts == 1


def test_a_successful_job_shows_its_return_value():
    result = add.enqueue(2, 3)
    execute(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', return_value = '5', status_rank = 2,"
        " started_at = clock_timestamp(), finished_at = clock_timestamp(),"
        " last_attempted_at = clock_timestamp(), worker_ids = '[\"w1\"]' WHERE id = %s",
        [result.id],
    )

    fetched = add.get_backend().get_result(result.id)

    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.is_finished
    assert fetched.return_value == 5
    assert fetched.finished_at is not None
    assert fetched.errors == []
    assert fetched.worker_ids == ["w1"]


def test_a_successful_job_may_return_structured_json():
    result = noop.enqueue()
    execute(
        "UPDATE shardq_job SET status = 'SUCCESSFUL', return_value = %s::jsonb WHERE id = %s",
        ['{"rows": [1, 2], "ok": true}', result.id],
    )

    assert noop.get_backend().get_result(result.id).return_value == {"rows": [1, 2], "ok": True}


def test_a_failed_job_shows_its_errors_as_task_errors():
    result = add.enqueue(1, "x")
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 1\nTypeError: bad operand'
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE shardq_job SET status = 'FAILED', finished_at = clock_timestamp(),"
            " errors = jsonb_build_array(jsonb_build_object("
            " 'exception_class_path', 'builtins.TypeError', 'traceback', %s::text))"
            " WHERE id = %s",
            [traceback, result.id],
        )

    fetched = add.get_backend().get_result(result.id)

    assert fetched.status == TaskResultStatus.FAILED
    assert fetched.errors == [TaskError(exception_class_path="builtins.TypeError", traceback=traceback)]
    assert fetched.errors[0].exception_class is TypeError
    with pytest.raises(ValueError, match="Task failed"):
        fetched.return_value


@pytest.mark.django_db
def test_a_successful_result_is_read_from_the_table_every_time_and_copies_are_independent():
    # No in-process cache: a pruned row must read as TaskResultDoesNotExist
    # in every process (test_prune.py).
    from django.test.utils import CaptureQueriesContext

    result = add.enqueue(2, 3)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE shardq_job SET status = 'SUCCESSFUL', return_value = '5', finished_at = now() WHERE id = %s",
            [int(result.id)],
        )
    first = add.get_result(result.id)
    first.worker_ids.append("mutated by the caller")
    with CaptureQueriesContext(connection) as queries:
        second = add.get_result(result.id)
    assert len(queries) == 1
    assert second.return_value == 5 and second.worker_ids == []


@pytest.mark.django_db
def test_an_unfinished_result_is_read_from_the_table_every_time():
    result = add.enqueue(2, 3)
    assert add.get_result(result.id).status == "READY"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE shardq_job SET status = 'RUNNING' WHERE id = %s", [int(result.id)])
    assert add.get_result(result.id).status == "RUNNING"
