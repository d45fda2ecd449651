"""The docs say what the code does: every SHARDQ key the code reads is in
configuration.md's table, admin.md counts the admin's entries, operations.md
calls nothing built "not built", and the README creates the database."""

import ast
import re
from pathlib import Path

from django.contrib import admin

from shardq.conf import DEFAULTS
from shardq.worker import metrics

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
# A key named in code or in a message: SHARDQ["KEY"], SHARDQ['KEY'].
NAMED_KEY = re.compile(r"SHARDQ\[['\"](\w+)['\"]\]")


def shardq_keys_the_code_reads() -> set[str]:
    """DEFAULTS (read merged, as raw["KEY"]), and every key read from an
    expression that mentions SHARDQ (getattr(settings, "SHARDQ", {}).get("KEY"),
    settings.SHARDQ["KEY"]) or named as SHARDQ["KEY"] in shardq/'s source."""
    keys = set(DEFAULTS)
    for path in (REPO / "shardq").rglob("*.py"):
        source = path.read_text()
        keys |= set(NAMED_KEY.findall(source))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                target, key = node.value, node.slice.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                target, key = node.func.value, node.args[0].value
            else:
                continue
            if isinstance(key, str) and "SHARDQ" in ast.unparse(target):
                keys.add(key)
    return keys


def configuration_table_keys() -> set[str]:
    text = (DOCS / "configuration.md").read_text()
    section = text.split("## `SHARDQ`", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def test_every_shardq_key_the_code_reads_is_in_the_configuration_table():
    read = shardq_keys_the_code_reads()

    assert {"SHARD_COUNT", "QUEUES", "METRICS_PORT", "MAX_RESULT_BYTES"} <= read  # the scan finds keys
    assert read - configuration_table_keys() == set()


def test_the_commands_table_names_every_shardq_command():
    text = (DOCS / "configuration.md").read_text()
    commands = {p.stem for p in (REPO / "shardq" / "management" / "commands").glob("shardq_*.py")}

    assert {c for c in commands if f"`manage.py {c}" not in text} == set()


def test_admin_md_counts_and_names_the_entries_of_the_admin_index():
    names = sorted(
        str(model._meta.verbose_name_plural).capitalize()
        for model in admin.site._registry
        if model._meta.app_label == "shardq"
    )
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    text = " ".join((DOCS / "admin.md").read_text().split())

    assert f"the admin index has {words[len(names)]} entries: {', '.join(names)}." in text


def test_operations_md_calls_no_outcome_shardq_counts_not_built():
    text = (DOCS / "operations.md").read_text()
    not_built = [p for p in re.split(r"\n\s*\n", text) if "Not built" in p]

    for outcome in metrics.OUTCOMES:
        assert not [p for p in not_built if f"`{outcome}`" in p], outcome
    assert "no task timeouts" not in text


def test_the_readme_creates_the_database_before_migrate():
    text = (REPO / "README.md").read_text()

    assert "createdb mysite" in text
    assert text.index("createdb mysite") < text.index("<!-- readme-test: migrate -->")


def test_operations_md_gives_the_deploy_order_migrate_workers_web():
    text = (DOCS / "operations.md").read_text()
    section = text.split("## Deploying a new version", 1)[1].split("\n## ", 1)[0]

    steps = [section.index(step) for step in ("1. **`manage.py migrate`**", "2. **The workers**", "3. **The web")]
    assert steps == sorted(steps)
    assert "UnknownTask" in section and "a task added in the new code" in section


def test_operations_md_explains_unknown_command_shardq_worker():
    text = (DOCS / "operations.md").read_text()
    section = text.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]

    assert "`Unknown command: 'shardq_worker'`" in section
    assert "INSTALLED_APPS" in section and "shardq.E009" in section
