"""The test settings with Django's default LOGGING (no LOGGING of our own):
what an operator sees from a worker whose project never tuned logging."""

from tests.settings import *  # noqa: F403

LOGGING = {}
