"""System checks (``manage.py check``), run through the backend's ``check()``.

Stable ids:
  shardq.E001  the database is not PostgreSQL
  shardq.E002  SHARD_COUNT is not a power of two in 1..16384
  shardq.E003  HEARTBEAT is not below half of LEASE_TTL
  shardq.E004  POLL_INTERVAL is not a positive number
  shardq.E005  MAX_PAYLOAD_BYTES is not a positive int
  shardq.E006  OPTIONS["DATABASE"] names no configured database
  shardq.E007  OPTIONS["UNIQUE_CACHE_SIZE"] is not an int >= 0
  shardq.E008  CHANNEL is not a usable LISTEN/NOTIFY channel name
  shardq.E009  a shardq backend is configured but "shardq" is not in INSTALLED_APPS
  shardq.E010  a key of a shardq backend's OPTIONS is unknown (misspelled)
  shardq.E011  a key of SHARDQ is unknown (misspelled)
  shardq.E012  TASK_TIMEOUT, MAX_ZOMBIES or ZOMBIE_GRACE is not a valid value
  shardq.E013  SHARDQ["QUEUES"] names a queue no shardq backend's QUEUES has
  shardq.E014  a HISTORY_* setting of SHARDQ is not a valid value
  shardq.E015  JOB_LOG_LEVEL or JOB_LOG_BYTES is not a valid value
  shardq.E016  DEAD_OWNER_DETECTION or DEAD_OWNER_CHECK is not a valid value
  shardq.W001  "shardq" is in INSTALLED_APPS but no TASKS backend is shardq's
               (E013 and W001 are in ``app_checks.py``: they need the backend
               class, and the backend imports this module)

E009 is reported through the backend's ``check()``, which Django runs once
``django.tasks`` is imported (a view or tasks module that enqueues does it):
without the app nothing of shardq's is loaded to register a check of its own.
So ``enqueue`` refuses the same mistakes too (``unusable()``), with the same
message, instead of failing on a missing table or on SQLite's SQL.
"""

import difflib

from django.apps import apps
from django.core import checks
from django.db import connections

from .conf import (
    DEFAULTS,
    dead_owner_check_seconds,
    dead_owner_detection,
    default_timeout_seconds,
    history_config,
    job_log_bytes,
    job_log_level,
    max_zombies,
    zombie_grace_seconds,
)
from .exceptions import ShardqConfigurationError, ShardqNotInstalled

# Every key a shardq backend reads from its OPTIONS (backend.py).
OPTION_KEYS = ("DATABASE", "PREPARED_STATEMENTS", "UNIQUE_CACHE_SIZE")

# PostgreSQL's NAMEDATALEN - 1: pg_notify() refuses a longer channel name and
# LISTEN truncates it, so every enqueue would fail (and workers listen elsewhere).
MAX_CHANNEL_BYTES = 63


def channel_error(channel) -> str | None:
    """Why ``channel`` cannot be a LISTEN/NOTIFY channel, or None when it can."""
    if not isinstance(channel, str):
        return f"is a {type(channel).__name__}, not a str"
    if not channel:
        return "is empty"
    if "\x00" in channel:
        return "holds a NUL character"
    try:
        size = len(channel.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds a lone surrogate (not valid Unicode)"
    if size > MAX_CHANNEL_BYTES:
        return f"is {size} bytes of UTF-8, over PostgreSQL's limit of {MAX_CHANNEL_BYTES}"
    return None


def unknown_keys(given, known, setting: str) -> list[tuple[str, str]]:
    """(message, hint) for each key of ``given`` not in ``known``, with the
    closest known key as a "did you mean"."""
    found = []
    for key in given:
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        message = f"{setting} has an unknown key {key!r}"
        message += f": did you mean {close[0]!r}?" if close else "."
        found.append((message, f"The keys shardq reads are {', '.join(sorted(known))}; any other is ignored."))
    return found


def missing_app_error(backend) -> checks.Error | None:
    if apps.is_installed("shardq"):
        return None
    return checks.Error(
        f"TASKS[{backend.alias!r}] uses shardq's backend, but 'shardq' is not in INSTALLED_APPS: "
        "migrate creates no shardq tables and manage.py has no shardq_worker.",
        hint="Add it: INSTALLED_APPS += ['shardq'], then run manage.py migrate.",
        id="shardq.E009",
    )


def refuse_without_app(backend) -> None:
    """Raise ``ShardqNotInstalled`` (E009's message) when the app is missing;
    called when a task is defined on ``backend``. Not before the app
    registry is populated (a task defined in an app's ``__init__``): the
    check and enqueue report it then."""
    if not apps.apps_ready:
        return
    error = missing_app_error(backend)
    if error is not None:
        raise ShardqNotInstalled(
            f"System check identified some issues:\n\nERRORS:\n?: ({error.id}) {error.msg} HINT: {error.hint}\n"
        )


def vendor_error(backend) -> checks.Error | None:
    alias = backend.database_alias
    vendor = connections[alias].vendor
    if vendor == "postgresql":
        return None
    return checks.Error(
        f"shardq needs PostgreSQL, but database {alias!r} is {vendor}.",
        hint="Point DATABASES[...]['ENGINE'] at django.db.backends.postgresql "
        "(PostgreSQL 15 or newer: SKIP LOCKED, LISTEN/NOTIFY).",
        id="shardq.E001",
    )


def unusable(backend) -> str | None:
    """Why ``backend`` cannot store a job (the app missing, a database that is
    not PostgreSQL), as the check says it; None when it can. Enqueue raises
    it, so a missed ``manage.py check`` still ends in a clear error."""
    error = missing_app_error(backend)
    if error is None and backend.database_alias in connections.settings:  # else E006: Django names the alias
        error = vendor_error(backend)
    return f"{error.msg} {error.hint}" if error else None


def backend_checks(backend) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    missing_app = missing_app_error(backend)
    if missing_app:
        errors.append(missing_app)
    for message, hint in unknown_keys(backend.options, OPTION_KEYS, f"TASKS[{backend.alias!r}]['OPTIONS']"):
        errors.append(checks.Error(message, hint=hint, id="shardq.E010"))
    from django.conf import settings

    for message, hint in unknown_keys(getattr(settings, "SHARDQ", {}), list(DEFAULTS), "SHARDQ"):
        errors.append(checks.Error(message, hint=hint, id="shardq.E011"))
    alias = backend.database_alias
    if alias not in connections.settings:
        return [
            *errors,
            checks.Error(
                f"TASKS[{backend.alias!r}]['OPTIONS']['DATABASE'] = {alias!r} is not in DATABASES.",
                hint="Name a database alias from settings.DATABASES (default: 'default').",
                id="shardq.E006",
            ),
        ]
    vendor = vendor_error(backend)
    if vendor:
        errors.append(vendor)
    raw = {**DEFAULTS, **getattr(settings, "SHARDQ", {})}
    count = raw["SHARD_COUNT"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1 or count > 16384 or count & (count - 1):
        errors.append(
            checks.Error(
                f"SHARDQ['SHARD_COUNT'] = {count!r} is not a power of two between 1 and 16384.",
                hint="Use 64 (the default) or another power of two, several times your largest worker count.",
                id="shardq.E002",
            )
        )
    ttl, beat = raw["LEASE_TTL"], raw["HEARTBEAT"]
    # Below half, not at half: a lease must outlive one missed heartbeat with
    # time to spare, and at exactly TTL/2 the second beat lands on the expiry.
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (ttl, beat))
    if not numbers or beat * 2 >= ttl:
        errors.append(
            checks.Error(
                f"SHARDQ['HEARTBEAT'] = {beat!r} must be a positive number below half of "
                f"SHARDQ['LEASE_TTL'] = {ttl!r}.",
                hint="A lease must survive one missed heartbeat: e.g. HEARTBEAT=10, LEASE_TTL=30.",
                id="shardq.E003",
            )
        )
    poll = raw["POLL_INTERVAL"]
    if not isinstance(poll, (int, float)) or poll <= 0:
        errors.append(
            checks.Error(
                f"SHARDQ['POLL_INTERVAL'] = {poll!r} is not a positive number of seconds.",
                hint="The default is 1.0.",
                id="shardq.E004",
            )
        )
    size = raw["MAX_PAYLOAD_BYTES"]
    if not isinstance(size, int) or size < 1:
        errors.append(
            checks.Error(
                f"SHARDQ['MAX_PAYLOAD_BYTES'] = {size!r} is not a positive int.",
                hint="The default is 1048576 (1 MiB).",
                id="shardq.E005",
            )
        )
    channel_problem = channel_error(raw["CHANNEL"])
    if channel_problem:
        errors.append(
            checks.Error(
                f"SHARDQ['CHANNEL'] = {raw['CHANNEL']!r} {channel_problem}.",
                hint="The PostgreSQL LISTEN/NOTIFY channel enqueue wakes workers on: a non-empty "
                f"str of at most {MAX_CHANNEL_BYTES} bytes of UTF-8 with no NUL character "
                "(default 'shardq').",
                id="shardq.E008",
            )
        )
    for key, check in (
        ("TASK_TIMEOUT", default_timeout_seconds),
        ("MAX_ZOMBIES", max_zombies),
        ("ZOMBIE_GRACE", zombie_grace_seconds),
    ):
        try:
            check(raw[key])
        except ShardqConfigurationError as exc:
            errors.append(
                checks.Error(
                    str(exc),
                    hint="Run control settings: docs/configuration.md (TASK_TIMEOUT None = no limit).",
                    id="shardq.E012",
                )
            )
    try:
        history_config(raw)
    except ShardqConfigurationError as exc:
        errors.append(
            checks.Error(str(exc), hint='History settings: docs/configuration.md, "History".', id="shardq.E014")
        )
    for keys, hint, check_id in (
        (
            (("JOB_LOG_LEVEL", job_log_level), ("JOB_LOG_BYTES", job_log_bytes)),
            "Per-job logs: docs/configuration.md (JOB_LOG_LEVEL, JOB_LOG_BYTES).",
            "shardq.E015",
        ),
        (
            (("DEAD_OWNER_DETECTION", dead_owner_detection), ("DEAD_OWNER_CHECK", dead_owner_check_seconds)),
            'Dead-owner detection: docs/reliability.md, "A worker that dies".',
            "shardq.E016",
        ),
    ):
        for key, check in keys:
            try:
                check(raw[key])
            except ShardqConfigurationError as exc:
                errors.append(checks.Error(str(exc), hint=hint, id=check_id))
    from .pooling import pooling_checks

    errors.extend(pooling_checks(backend))  # WORKER_DATABASE, a worker behind a transaction pool
    cache = backend.options.get("UNIQUE_CACHE_SIZE", 0)
    if not isinstance(cache, int) or isinstance(cache, bool) or cache < 0:
        errors.append(
            checks.Error(
                f"TASKS[{backend.alias!r}]['OPTIONS']['UNIQUE_CACHE_SIZE'] = {cache!r} is not an int >= 0.",
                hint="The number of recently seen unique keys each process remembers "
                "(default 1024); 0 turns the cache off.",
                id="shardq.E007",
            )
        )
    return errors
