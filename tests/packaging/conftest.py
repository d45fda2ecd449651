"""One wheel for the packaging tests (built once a run)."""

from pathlib import Path

import pytest

from tests.packaging.wheels import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist"))
