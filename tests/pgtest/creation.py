"""The tests' database creation: each test database a copy of one migrated
template, and none dropped when the run ends.

Django creates a test database by running every migration into an empty one
(about 2.6 s here, each xdist worker its own), and drops it when the run
ends. On PostgreSQL ``DROP DATABASE`` forces a checkpoint of the whole
server (it waits for every dirty buffer of every database to be written:
0.6 s to 12 s on this shared server). Here:

- The first session to need it migrates a template database,
  ``test_<NAME>_template``, and labels it (``COMMENT ON DATABASE``) with a
  fingerprint of what migrate would build: the Django version, the
  installed apps, every migration file and the model module the migrations
  import, and the shard count the migrations read. A later session, or the
  other xdist workers of this one, finds the label and reuses it; a changed
  migration changes the label and the template is built again.
- Each test database (``test_<NAME>``, ``test_<NAME>_gw0``, ...) is
  ``CREATE DATABASE ... TEMPLATE`` of it: a block copy through the WAL
  (PostgreSQL 15's ``STRATEGY WAL_LOG``, no checkpoint). Django's own
  ``create_test_db`` then runs on it as on a kept database, so ``migrate``
  still runs (it finds every migration applied, and ``post_migrate`` writes
  what the code of this checkout writes: the shard rows, the content types
  and permissions) and so does ``createcachetable``.
- When the run ends the test database is kept, not dropped; the next run
  drops it before its copy (a checkpoint then, as before, and none in a CI
  run that runs the suite once).

An advisory lock on the server serialises the check, the build and the
copies, so xdist workers that start together build the template once.
``SHARDQ_TEST_TEMPLATE=off`` (or pytest-django's ``--reuse-db`` or
``--no-migrations``) runs Django's own creation and teardown instead.
``tests/integration/test_test_engine.py`` checks that a copy holds what a
migrate builds.
"""

import hashlib
import os
from importlib import import_module
from pathlib import Path

import django
from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db.backends.postgresql import creation
from django.db.migrations.loader import MigrationLoader

#: The advisory lock around the template's check, build and copies (any
#: fixed key; the template's name is in the lock's second half).
LOCK_CLASS = 0x5348_5144  # "SHDQ"
#: Modules the migrations import whose code shapes the schema they build.
MIGRATION_IMPORTS = ("shardq.models",)


def template_enabled() -> bool:
    return os.environ.get("SHARDQ_TEST_TEMPLATE", "on") != "off"


def fingerprint() -> str:
    """What a migrate of an empty database depends on, hashed."""
    digest = hashlib.sha256()
    digest.update(f"django {django.__version__}\n".encode())
    shard_count = getattr(settings, "SHARDQ", {}).get("SHARD_COUNT")
    digest.update(f"shard count {shard_count!r}\n".encode())
    for app in apps.get_app_configs():
        digest.update(f"app {app.label} {app.name}\n".encode())
        module_name, _explicit = MigrationLoader.migrations_module(app.label)
        if module_name is None:
            continue
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        for directory in getattr(module, "__path__", []):
            for path in sorted(Path(directory).glob("*.py")):
                digest.update(f"file {module_name} {path.name}\n".encode())
                digest.update(path.read_bytes())
    for module_name in MIGRATION_IMPORTS:
        path = Path(import_module(module_name).__file__)
        digest.update(f"module {module_name}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class DatabaseCreation(creation.DatabaseCreation):
    #: The template the test database was copied from (None: Django's own creation).
    from_template: str | None = None

    def template_name(self) -> str:
        return f"test_{self.connection.settings_dict['NAME']}_template"[:63]

    def create_test_db(self, verbosity=1, autoclobber=False, serialize=None, keepdb=False):
        if keepdb or not template_enabled() or self.connection.settings_dict["TEST"].get("MIGRATE") is False:
            self.from_template = None
            return super().create_test_db(verbosity, autoclobber, serialize, keepdb)
        name = self._get_test_db_name()
        template = self.template_name()
        label = fingerprint()
        quote = self._quote_name
        self.connection.close()
        with self._nodb_cursor() as cursor:
            lock = [LOCK_CLASS, int(hashlib.sha256(template.encode()).hexdigest()[:7], 16)]
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", lock)
            try:
                cursor.execute(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", [template]
                )
                row = cursor.fetchone()
                if row is None or row[0] != label:
                    if verbosity >= 1:
                        self.log(f"Migrating the template test database {template}...")
                    if row is not None:
                        cursor.execute(f"DROP DATABASE {quote(template)}")
                    self._build_template(cursor, template, label, verbosity)
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if cursor.fetchone() is not None:
                    if verbosity >= 1:
                        self.log(f"Destroying old test database {name}...")
                    cursor.execute(f"DROP DATABASE {quote(name)}")
                cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(template)}")
            finally:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
        # Django's own steps on the copy, as on a kept database: migrate
        # (every migration applied; post_migrate runs), createcachetable.
        self.from_template = template
        return super().create_test_db(verbosity, autoclobber, serialize, keepdb=True)

    def _build_template(self, cursor, template: str, label: str, verbosity: int) -> None:
        quote = self._quote_name
        cursor.execute(f"CREATE DATABASE {quote(template)} {self.sql_table_creation_suffix()}")
        saved = self.connection.settings_dict["NAME"]
        self.connection.settings_dict["NAME"] = template
        try:
            call_command(
                "migrate",
                verbosity=max(verbosity - 1, 0),
                interactive=False,
                database=self.connection.alias,
                run_syncdb=True,
            )
        except BaseException:
            self.connection.close()
            cursor.execute(f"DROP DATABASE IF EXISTS {quote(template)}")
            raise
        finally:
            self.connection.close()
            self.connection.settings_dict["NAME"] = saved
        # The label last: a build that failed half-way is never taken for whole.
        cursor.execute(f"COMMENT ON DATABASE {quote(template)} IS %s", [label])

    def destroy_test_db(self, old_database_name=None, verbosity=1, keepdb=False, suffix=None):
        # A copy of the template is kept: its DROP would checkpoint the
        # server now; the next run drops it before copying again.
        kept = keepdb or (suffix is None and getattr(self, "from_template", None) is not None)
        return super().destroy_test_db(old_database_name, verbosity, kept, suffix)
