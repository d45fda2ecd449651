"""The named blocks of queries.sql: an expression written once and included as {{name}}."""

import pytest

from shardq.db.queries import QUERIES, load, positional


def test_a_block_includes_another_in_parentheses(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text(
        "-- name: alive\n-- An expression.\nx.beat > %(ttl)s\n\n"
        "-- name: count_alive\n-- Uses it twice.\nSELECT count(*) FILTER (WHERE {{alive}}), bool_or({{alive}}) FROM x;\n"
    )
    assert load(path)["count_alive"] == (
        "SELECT count(*) FILTER (WHERE (x.beat > %(ttl)s)), bool_or((x.beat > %(ttl)s)) FROM x"
    )


def test_an_include_of_a_missing_block_fails_at_load(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- name: a\n-- Broken.\nSELECT {{nope}};\n")
    with pytest.raises(KeyError, match=r"\{\{nope\}\} names no block"):
        load(path)


def test_worker_liveness_is_one_definition_shared_by_the_status_statements():
    definition = QUERIES["worker_liveness"]
    assert definition in QUERIES["status_workers"] and definition in QUERIES["status_pools"]
    text, params = positional("worker_liveness", {"ttl": 30.0})
    assert "%(" not in text and params == [30.0]
