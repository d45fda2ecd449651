"""The worker's LISTEN connection: a table of channels, each with its subscriber.

The worker fills ``{channel: Subscription}`` at construction (River's
notifier, ``Listen(topic, fn)``); the listener knows channels, not the
services behind them. A subscriber parses its payloads itself: any database
login can NOTIFY, so a payload is untrusted input (``parse_notify`` in
fetcher.py for the jobs channel).

Rate limits belong to the subscribers too (``WakeLimiter``): a wake-up held
back by one is delivered by the subscriber's ``flush``, which the listener
calls after every wait, and the listener waits only briefly (5 ms) while any
subscriber says one is ``pending``, so it goes out on time.

On every (re)connection the listener LISTENs on every channel of the table,
sets ``listening`` and calls ``on_connected``: the worker's fetcher then
claims at once, covering what was sent while the connection was down. A
connection error reconnects with backoff; anything else stops the thread
with ``failure`` set, and the worker stops loudly.
"""

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg

from ..db.store import connect, listen
from ..exceptions import DatabaseUnavailable
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.fetcher")

# The longest wait for a notification while none is pending: how long a stop
# waits for the listener's thread (a blocked notifies() cannot be woken: it
# holds the connection's lock). A wait that ends idle costs one poll() of
# the socket; a notification ends it at once, whatever its length. At 0.5 s
# every in-process worker's stop took 0.4 s on average (the tests start ~70).
IDLE_WAIT_SECONDS = 0.1


def _never() -> bool:
    return False


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class Subscription:
    """What the listener does with one channel's notifications."""

    #: Called with each payload, on the listener's thread.
    notified: Callable[[str], None]
    #: Is a wake-up held back by a rate limit waiting to go out?
    pending: Callable[[], bool] = _never
    #: Deliver the held-back wake-ups that are due (called after every wait).
    flush: Callable[[], None] = _nothing


class WakeLimiter:
    """At most one wake-up per ``interval`` seconds; a wake-up asked for
    within the interval is delivered once when it ends (``due``), so a flood
    of NOTIFYs costs a bounded number of statements and none is lost."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.last = -math.inf
        self.pending = False

    def ask(self) -> bool:
        """True: wake now. False: suppressed (delivered by ``due`` later)."""
        now = self.clock()
        if now - self.last >= self.interval:
            self.last, self.pending = now, False
            return True
        self.pending = True
        return False

    def due(self) -> bool:
        """A suppressed wake-up whose interval has ended: deliver it now."""
        if self.pending and self.clock() - self.last >= self.interval:
            self.last, self.pending = self.clock(), False
            return True
        return False


class Listener(Service):
    name = "listener"

    def __init__(
        self,
        alias: str,
        stats: Stats,
        subscriptions: Mapping[str, Subscription],
        on_connected: Callable[[], None] = _nothing,
        on_session: "Callable[[psycopg.Connection], None] | None" = None,
    ) -> None:
        super().__init__()
        self.alias = alias
        self.stats = stats
        self.subscriptions = dict(subscriptions)
        self.on_connected = on_connected
        # Told of each new connection once it LISTENs (dead-owner detection
        # records this session beside the lease session: runtime.py).
        self.on_session = on_session
        self.conn: psycopg.Connection | None = None
        self.backend_pid: int | None = None
        # Set once the LISTENs are in: the worker announces its join only
        # then, or the release its announcement causes comes before it
        # listens and it takes its share a heartbeat late.
        self.listening = threading.Event()

    def after_stop(self, deadline: float) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # already broken: nothing to close
                pass

    def on_notify(self, channel: str, payload: str) -> None:
        subscription = self.subscriptions.get(channel)
        if subscription is not None:
            subscription.notified(payload)

    def pending(self) -> bool:
        return any(subscription.pending() for subscription in self.subscriptions.values())

    def flush(self) -> None:
        for subscription in self.subscriptions.values():
            subscription.flush()

    def run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                self.conn = connect(self.alias, application_name="shardq-listener")
                listen(self.conn, *self.subscriptions)
                if self.on_session is not None:
                    self.on_session(self.conn)
                self.listening.set()
                self.backend_pid = self.conn.info.backend_pid
                delay = 0.1
                # The gap while we were disconnected is covered by the poll.
                self.on_connected()
                while not self._stop.is_set():
                    # Short waits only while a suppressed wake-up is pending.
                    pending = self.pending()
                    for note in self.conn.notifies(timeout=0.005 if pending else IDLE_WAIT_SECONDS, stop_after=256):
                        self.on_notify(note.channel, note.payload)
                        if not pending and self.pending():
                            break  # deliver it on time, not when this wait ends
                    self.flush()
            except (DatabaseUnavailable, psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self.stats.add("db_errors")
                logger.info("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                if self.conn is not None:
                    try:
                        self.conn.close()
                    except Exception:  # already broken
                        pass
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
