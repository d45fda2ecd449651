"""The xdist groups of tests/conftest.py: each names files that exist, and
the scheduler's unit for a grouped file's test is its group (pytest 9.2's
node ids no longer carry xdist's ``@group`` suffix, so the scheduler groups
by file)."""

from pathlib import Path

from tests.conftest import XDIST_FIXTURE_FILES, XDIST_GROUPS, _group_of_file

TESTS = Path(__file__).resolve().parent.parent


def test_every_grouped_file_exists_and_maps_to_its_group():
    for group, paths in (*XDIST_GROUPS.items(), *XDIST_FIXTURE_FILES.items()):
        for path in paths:
            assert (TESTS / path).is_file(), path
            assert _group_of_file(path) == group


def test_a_file_in_no_group_is_in_none():
    assert _group_of_file("unit/test_xdist_groups.py") is None
    assert _group_of_file("integration/test_claim_limited_plan.py") is None
