"""shardq's pytest plugin: the ``shardq_drain`` fixture, for pytest-django.

pytest loads it through the ``pytest11`` entry point of shardq's
distribution (nothing to configure); with plugin autoloading off
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD``) name it in a conftest.py:
``pytest_plugins = ["shardq.testing.pytest_plugin"]`` (both at once are
fine). Only this module imports pytest, and it imports nothing of Django's
until a test asks for the fixture: loading the plugin never configures
Django.
"""

from typing import Any

import pytest


class ShardqDrain:
    """What ``shardq_drain`` gives a test: call it to drain (the arguments of
    ``shardq.testing.drain``); ``enqueued``, ``assert_enqueued`` and
    ``assert_not_enqueued`` are shardq.testing's."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from shardq.testing import drain

        return drain(*args, **kwargs)

    def enqueued(self, *args: Any, **kwargs: Any) -> Any:
        from shardq.testing import enqueued

        return enqueued(*args, **kwargs)

    def assert_enqueued(self, *args: Any, **kwargs: Any) -> Any:
        from shardq.testing import assert_enqueued

        return assert_enqueued(*args, **kwargs)

    def assert_not_enqueued(self, *args: Any, **kwargs: Any) -> None:
        from shardq.testing import assert_not_enqueued

        assert_not_enqueued(*args, **kwargs)


@pytest.fixture
def shardq_drain(db: None) -> ShardqDrain:
    """Drain shardq jobs inside the test: ``report = shardq_drain()``.

    Gives the test pytest-django's ``db`` (one transaction, rolled back at
    the end) unless it asked for ``transactional_db`` or
    ``@pytest.mark.django_db(transaction=True)``, which then win. ``db`` is
    a parameter, not looked up when the fixture runs: pytest-django decides
    which test databases to create from the fixtures it sees at collection.
    Without pytest-django, pytest reports "fixture 'db' not found"."""
    return ShardqDrain()
