"""The one place that runs shardq's SQL (``queries.sql``).

``WorkerStore`` owns a worker's psycopg connections; the enqueue path runs on
the caller's Django connection (see ``backend.py``). Driver errors are
translated at this boundary into ``DatabaseUnavailable``.
"""

import json
import logging

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

from ..conf import get_config
from ..exceptions import DatabaseUnavailable
from .queries import QUERIES

logger = logging.getLogger("shardq.store")


def ensure_shards(sender=None, using=DEFAULT_DB_ALIAS, **kwargs):
    """post_migrate: one shardq_shard row per configured shard."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["ensure_shards"], {"count": get_config().shard_count})


def connection_kwargs(alias: str = DEFAULT_DB_ALIAS) -> dict:
    """psycopg connect() arguments of a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    params.pop("pool", None)
    params.pop("assume_role", None)
    return params


def connect(alias: str = DEFAULT_DB_ALIAS, autocommit: bool = True, application_name: str = "shardq") -> psycopg.Connection:
    try:
        return psycopg.connect(
            **connection_kwargs(alias), autocommit=autocommit, application_name=application_name
        )
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect to PostgreSQL: {exc}".strip()) from exc


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))
