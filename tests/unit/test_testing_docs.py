"""docs/testing.md: its Python examples parse, and it names every public
helper of shardq.testing and every parameter of drain()."""

import ast
import inspect
import re
from pathlib import Path

import shardq.testing
from shardq.testing import draining

DOC = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()


def test_the_python_examples_parse():
    blocks = re.findall(r"```python\n(.*?)```", DOC, re.S)
    assert len(blocks) >= 4
    for block in blocks:
        ast.parse(block)


def test_every_public_helper_and_every_drain_parameter_is_documented():
    undocumented = [name for name in shardq.testing.__all__ if f"`{name}" not in DOC and name not in DOC]
    parameters = [p for p in inspect.signature(draining.drain).parameters if f"{p}=" not in DOC]
    assert undocumented == [] and parameters == []
