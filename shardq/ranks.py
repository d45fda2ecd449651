"""The guard shardq uses on its own rows, for yours: a rank that only goes up.

An order handled by several jobs (preparing -> shipped -> delivered) must
never move backwards when a late or repeated message arrives: each state
gets a rank, and a write applies only if it raises the rank::

    class Order(RankedModel):           # adds status_rank
        status = models.CharField(max_length=20)

    advance(order, to=Order.SHIPPED_RANK, status="shipped")   # True or False

It is one ``UPDATE ... SET rank = :to, ... WHERE pk = ... AND rank < :to``:
PostgreSQL's row lock orders two racing writers, the second re-reads the row
and applies only if its rank is still higher. It is written through the ORM
(a queryset ``update``) rather than as a block of shardq/db/sql/: the
table is the user's model, with its own name, columns, database router and
manager, which only the ORM knows; shardq/db holds the statements on
shardq's own tables.
"""

from typing import Any

from django.db import models


class RankedModel(models.Model):
    """Abstract mixin: a ``status_rank`` that ``advance`` only ever raises."""

    status_rank = models.IntegerField(default=0)

    class Meta:
        abstract = True


def advance(target: Any, rank_field: str = "status_rank", *, to: int, **updates: Any) -> bool:
    """Set ``rank_field`` to ``to`` (and ``updates``) only where it is lower.

    ``target`` is a model instance (its row, by primary key; on success the
    instance gets the new values too) or a queryset (every row in it whose
    rank is lower). Returns whether any row was written: False means a write
    of an equal or higher rank got there first, and nothing changed."""
    if isinstance(to, bool) or not isinstance(to, int):
        raise TypeError(f"advance: to must be an int rank, not {to!r}")
    if rank_field in updates:
        raise TypeError(f"advance: {rank_field} is set by to=, not as an update")
    if isinstance(target, models.Model):
        if target.pk is None:
            raise ValueError(f"advance: {target!r} has no primary key (save it first)")
        manager = type(target)._default_manager
        queryset = manager.using(target._state.db or manager.db).filter(pk=target.pk)
    elif isinstance(target, models.QuerySet):
        queryset = target
    else:
        raise TypeError(f"advance: give a model instance or a queryset, not {type(target).__name__}")
    try:
        queryset.model._meta.get_field(rank_field)
    except Exception as exc:
        raise ValueError(
            f"advance: {queryset.model.__name__} has no field {rank_field!r} (add RankedModel, or name "
            "the rank field with rank_field=)"
        ) from exc
    applied = queryset.filter(**{f"{rank_field}__lt": to}).update(**{rank_field: to}, **updates) > 0
    if applied and isinstance(target, models.Model):
        setattr(target, rank_field, to)
        for name, value in updates.items():
            setattr(target, name, value)
    return applied
