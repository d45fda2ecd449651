"""``shardq.advance`` (issue 16): a user's row guarded as shardq guards its
own, one UPDATE ... WHERE rank < :to. Two writers race on one order in both
orders of arrival (the first holds the row lock until the second waits on
it); the order ends at the higher rank either way."""

import threading

import pytest
from django.db import connection, connections, transaction

from example_project.demo.models import Order
from shardq import advance
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

RANKS = Order.RANKS


def waiting_for_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def race(order_id: int, first: str, second: str) -> dict[str, bool]:
    """``first`` writes and holds its transaction open; ``second`` arrives and
    waits on the row; then ``first`` commits."""
    applied: dict[str, bool] = {}
    wrote = threading.Event()
    release = threading.Event()

    def writer(status: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                applied[status] = advance(Order.objects.filter(pk=order_id), to=RANKS[status], status=status)
                if hold:
                    wrote.set()
                    release.wait(30)
        finally:
            connections.close_all()

    a = threading.Thread(target=writer, args=(first, True))
    a.start()
    assert wrote.wait(30)
    b = threading.Thread(target=writer, args=(second, False))
    b.start()
    wait_until(waiting_for_a_lock, message=f"{second} to wait on the row {first} holds")
    release.set()
    a.join(30)
    b.join(30)
    return applied


@pytest.mark.parametrize(("first", "second"), [("packed", "shipped"), ("shipped", "packed")])
def test_two_racing_writers_leave_the_order_at_the_higher_rank(first, second):
    order = Order.objects.create(customer_id=1, total_cents=100)
    applied = race(order.pk, first, second)
    order.refresh_from_db()
    assert (order.status, order.status_rank) == ("shipped", RANKS["shipped"])
    # The later, lower write reports that it changed nothing.
    assert applied == {"packed": first == "packed", "shipped": True}


def test_advance_on_an_instance_updates_it_only_when_it_applied():
    order = Order.objects.create(customer_id=1, total_cents=100)
    assert advance(order, to=RANKS["charged"], status="charged") is True
    assert (order.status, order.status_rank) == ("charged", 1)
    stale = Order.objects.get(pk=order.pk)
    assert advance(order, to=RANKS["closed"], status="closed") is True
    assert advance(stale, to=RANKS["packed"], status="packed") is False
    assert (stale.status, stale.status_rank) == ("charged", 1)  # untouched: it did not apply
    assert advance(order, to=RANKS["closed"], status="closed") is False  # equal rank: no
    order.refresh_from_db()
    assert (order.status, order.status_rank) == ("closed", 4)


def test_advance_refuses_what_it_cannot_guard():
    order = Order.objects.create(customer_id=1, total_cents=100)
    with pytest.raises(TypeError, match="int rank"):
        advance(order, to="2")
    with pytest.raises(TypeError, match="set by to="):
        advance(order, to=2, status_rank=3)
    with pytest.raises(ValueError, match="no field 'rank'"):
        advance(order, rank_field="rank", to=2)
    with pytest.raises(ValueError, match="no primary key"):
        advance(Order(customer_id=1, total_cents=1), to=1)
    with pytest.raises(TypeError, match="model instance or a queryset"):
        advance([order], to=1)
