"""Redaction in the admin: see ``shardq.tasks.redaction`` (the worker's
log uses the same rule)."""

from ..tasks.redaction import REDACTED, redact_arguments, shard_key_is_sensitive

__all__ = ["REDACTED", "redact_arguments", "shard_key_is_sensitive"]
