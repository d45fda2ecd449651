"""Key → shard: MurmurHash3 of the key's hashtag, fixed for the life of the system."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mmh3
import pytest
from django.db import connection

import shardq
from shardq import shard_task
from shardq.core.hashing import shard_key_hash
from tests.helpers import job_row
from tests.taskapp.tasks import keyed, noop

pytestmark = pytest.mark.django_db

SHARDS = 64
REPO = Path(__file__).resolve().parents[2]


@shard_task(key=lambda args, kwargs: f"tenant:{{{kwargs['tenant']}}}:doc:{kwargs['doc']}")
def reindex(*, tenant: str, doc: int) -> None:
    """Keyed by a callable that builds a hashtag key."""


def shard_of(key: str) -> int:
    return mmh3.hash(key, 0, signed=True) & (SHARDS - 1)


def test_a_keyed_job_is_stored_with_the_murmur3_hash_of_its_key():
    row = job_row(keyed.enqueue(user_id=42).id)

    # Literal values: MurmurHash3 x86_32, seed 0, of b"42" — they must never change.
    assert row["shard_key"] == "42"
    assert row["key_hash"] == -1135041482
    assert row["shard"] == 54


def test_the_hash_function_is_murmur3_x86_32_with_seed_zero():
    # The reference test vector of MurmurHash3_x86_32("hello", seed=0).
    assert shard_key_hash("hello") == 0x248BFA47


@pytest.mark.process
def test_a_keys_shard_is_the_same_in_a_fresh_process():
    keys = ["42", "user:7", "order:{42}:line:7", "émoji-🐎", "", "{}", "x" * 500]
    rows = [job_row(keyed.using(shard_key=key).enqueue(user_id=1).id) for key in keys]
    script = (
        "import json, sys\n"
        "from shardq.core.hashing import shard_key_hash\n"
        "keys = json.load(sys.stdin)\n"
        "print(json.dumps([[shard_key_hash(k), shard_key_hash(k) & 63] for k in keys]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # Python's own str hash differs per process.

    out = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(keys),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    ).stdout

    assert json.loads(out) == [[row["key_hash"], row["shard"]] for row in rows]


def test_python_and_postgresql_agree_on_the_shard_of_a_negative_hash():
    results = shardq.enqueue_many(keyed, [((user_id,), {}) for user_id in range(200)])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE key_hash < 0), count(*) FILTER (WHERE shard <> key_hash & 63)"
            " FROM shardq_job WHERE id = ANY(%s)",
            [[int(r.id) for r in results]],
        )
        negative, disagreeing = cursor.fetchone()

    assert negative > 50
    assert disagreeing == 0


def test_a_power_of_two_reshard_moves_a_key_to_its_shard_or_shard_plus_64():
    results = shardq.enqueue_many(keyed, [((user_id,), {}) for user_id in range(500)])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM shardq_job WHERE id = ANY(%s) AND (key_hash & 127) NOT IN (shard, shard + 64)",
            [[int(r.id) for r in results]],
        )
        assert cursor.fetchone()[0] == 0


def test_hashtag_keys_hash_only_the_tag():
    line = job_row(keyed.using(shard_key="order:{42}:line:7").enqueue(user_id=1).id)
    invoice = job_row(keyed.using(shard_key="invoice:{42}").enqueue(user_id=2).id)
    plain = job_row(keyed.enqueue(user_id=42).id)

    assert line["shard_key"] == "order:{42}:line:7"
    assert line["key_hash"] == invoice["key_hash"] == plain["key_hash"] == mmh3.hash("42")
    assert line["shard"] == invoice["shard"] == plain["shard"]


def test_an_empty_or_unclosed_hashtag_hashes_the_whole_key():
    assert shard_key_hash("user:{}") == mmh3.hash("user:{}")
    assert shard_key_hash("user:{42") == mmh3.hash("user:{42")
    assert shard_key_hash("a{b}c{d}") == mmh3.hash("b")  # the first tag only


def test_a_callable_key_with_a_hashtag_keeps_a_tenant_on_one_shard():
    rows = [job_row(reindex.enqueue(tenant="acme", doc=doc).id) for doc in range(20)]

    assert {row["shard"] for row in rows} == {shard_of("acme")}
    assert rows[3]["shard_key"] == "tenant:{acme}:doc:3"


def test_every_job_of_a_key_lands_on_the_same_shard():
    calls = [((n % 40,), {"note": str(n)}) for n in range(800)]
    results = shardq.enqueue_many(keyed, calls)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard_key, count(DISTINCT shard), min(shard) FROM shardq_job WHERE id = ANY(%s) GROUP BY shard_key",
            [[int(r.id) for r in results]],
        )
        groups = cursor.fetchall()

    assert len(groups) == 40
    assert all(distinct == 1 and shard == shard_of(key) for key, distinct, shard in groups)


def test_using_shard_key_overrides_the_tasks_key():
    row = job_row(keyed.using(shard_key="{42}").enqueue(user_id=7).id)

    assert shard_of("7") != shard_of("42")
    assert row["shard_key"] == "{42}"
    assert row["shard"] == shard_of("42")


def test_using_shard_key_accepts_an_int_and_gives_an_unkeyed_task_a_key():
    assert job_row(keyed.using(shard_key=42).enqueue(user_id=7).id)["shard_key"] == "42"

    row = job_row(noop.using(shard_key="tenant-9").enqueue().id)
    assert row["shard_key"] == "tenant-9"
    assert row["shard"] == shard_of("tenant-9")


def test_unkeyed_jobs_spread_evenly_over_all_64_shards():
    results = shardq.enqueue_many(noop, [((), {})] * 6400)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT shard, count(*) FROM shardq_job WHERE id = ANY(%s) GROUP BY shard",
            [[int(r.id) for r in results]],
        )
        per_shard = dict(cursor.fetchall())

    # 100 a shard expected; 50..150 is five standard deviations either side.
    assert sorted(per_shard) == list(range(SHARDS))
    assert all(50 <= n <= 150 for n in per_shard.values()), per_shard
    assert sum(per_shard.values()) == 6400


def test_unkeyed_jobs_have_no_shard_key():
    row = job_row(noop.enqueue().id)

    assert row["shard_key"] is None
    assert row["shard"] == row["key_hash"] & (SHARDS - 1)
