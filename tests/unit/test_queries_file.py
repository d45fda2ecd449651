"""The named blocks of shardq/db/sql/: an expression written once and included as {{name}}."""

import pytest

from shardq.db.queries import CACHED_STATEMENT_BYTES, QUERIES, RAW_QUERIES, load, positional, raw, sql_files


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


def test_every_block_says_what_it_does_in_lines_a_reader_can_read():
    count = 0
    for path in sql_files():
        text = path.read_text().splitlines()
        blocks = [i for i, line in enumerate(text) if line.startswith("-- name:")]
        count += len(blocks)
        for i in blocks:
            assert text[i + 1].startswith("-- ") and len(text[i + 1]) > 10, f"{path.name}: {text[i]} has no description"
        too_long = [(n + 1, len(line)) for n, line in enumerate(text) if line.startswith("--") and len(line) > 120]
        assert too_long == [], f"{path.name}: comment lines over 120 characters (line, length): {too_long}"
    assert count == len(QUERIES)


def test_the_sql_is_one_file_a_table_and_a_name_is_used_once_across_them(tmp_path):
    assert {p.stem for p in sql_files()} >= {"job", "shard", "worker", "limit"}
    (tmp_path / "a.sql").write_text("-- name: x\n-- One.\nSELECT 1;\n")
    (tmp_path / "b.sql").write_text("-- name: y\n-- Uses a's.\nSELECT {{x}};\n\n-- name: x\n-- Again.\nSELECT 2;\n")
    with pytest.raises(ValueError, match=r"b\.sql: a block named 'x' is in another file too"):
        load(tmp_path / "a.sql", tmp_path / "b.sql")
    (tmp_path / "b.sql").write_text("-- name: y\n-- Uses a's.\nSELECT {{x}};\n")
    assert load(tmp_path / "a.sql", tmp_path / "b.sql")["y"] == "SELECT (SELECT 1)"


def test_comment_lines_after_a_statement_are_not_part_of_it(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- name: a\n-- One.\nSELECT 1;\n\n-- About the next block.\n\n-- name: b\n-- Two.\nSELECT 2;\n")
    assert load(path) == {"a": "SELECT 1", "b": "SELECT 2"}


def test_a_description_over_several_lines_is_not_part_of_the_statement(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- name: a\n-- Says what it does,\n-- over two lines.\nSELECT 1;\n")
    assert load(path)["a"] == "SELECT 1"


def test_a_bare_include_continues_a_list(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text(
        "-- name: cols\n-- A list.\na, b\n\n-- name: copy\n-- Uses it bare.\nCOPY t ({{cols*}}, c) FROM STDIN;\n"
    )
    assert load(path)["copy"] == "COPY t (a, b, c) FROM STDIN"


def test_the_job_column_list_is_written_once():
    text = QUERIES["job_columns"]
    assert QUERIES["copy_jobs"].count(text) == 1 and QUERIES["copy_workflow_jobs"].count(text) == 1
    assert QUERIES["insert_job"].count(text) == 1 and QUERIES["insert_unique_job"].count(text) == 1


def test_a_raw_statement_numbers_each_name_once_and_unescapes_percent():
    text, names = raw("SELECT %(a)s, format('%%s', %(b)s), %(a)s + 1")
    assert text == "SELECT $1, format('%s', $2), $1 + 1"
    assert names == ("a", "b")


def test_the_statements_psycopg_would_parse_on_every_execute_run_raw():
    # claim_jobs is over psycopg's cache limit; every long one is raw, with no placeholder left.
    assert "claim_jobs" in RAW_QUERIES
    for name, (text, names) in RAW_QUERIES.items():
        assert len(QUERIES[name].encode()) > CACHED_STATEMENT_BYTES
        assert "%(" not in text and "%%" not in text
        assert f"${len(names)}" in text and f"${len(names) + 1}" not in text
