"""A module of an installed app that fails to import with something other
than ImportError (a module-level bug, a half-deployed file): a job row may
name it as its task path (tests/isolation/test_row_values.py)."""

raise RuntimeError("broken_module: a bug at import time")
