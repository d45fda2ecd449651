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
"""

from django.core import checks
from django.db import connections

from .conf import DEFAULTS

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


def backend_checks(backend) -> list[checks.CheckMessage]:
    errors = []
    alias = backend.database_alias
    if alias not in connections.settings:
        return [
            checks.Error(
                f"TASKS[{backend.alias!r}]['OPTIONS']['DATABASE'] = {alias!r} is not in DATABASES.",
                hint="Name a database alias from settings.DATABASES (default: 'default').",
                id="shardq.E006",
            )
        ]
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        errors.append(
            checks.Error(
                f"shardq needs PostgreSQL, but database {alias!r} is {vendor}.",
                hint="Point DATABASES[...]['ENGINE'] at django.db.backends.postgresql "
                "(PostgreSQL 15 or newer: SKIP LOCKED, LISTEN/NOTIFY).",
                id="shardq.E001",
            )
        )
    from django.conf import settings

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
