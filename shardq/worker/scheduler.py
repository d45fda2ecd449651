"""The periodic-task scheduler of one worker process (see ``shardq.cron``).

About once a second it enqueues, for every registered schedule, the ticks
that fell due since it last looked, at most ``CATCH_UP_SECONDS`` back (a
database outage does not replay an hour of ticks). At its first look it
offers only the newest tick of that window: a restart that straddled a tick
does not lose it, and a per-second schedule does not get a minute of ticks
at every start. Each tick is a unique job
keyed by (schedule, tick), so the schedulers of every worker process can all
offer it and the table keeps one.

State model, per schedule: ``looked_until`` (the wall-clock instant up to
which every tick was enqueued) only moves forward after the enqueue of every
tick up to it succeeded; a failed enqueue (database unavailable) leaves it
where it was, and the next look retries the same ticks.
"""

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import close_old_connections, connections
from django.db.utils import Error as DatabaseError

from ..cron import CATCH_UP_SECONDS, MAX_TICKS_PER_LOOK, Schedule, due_ticks
from .service import Service
from .stats import Stats

logger = logging.getLogger("shardq.worker.scheduler")


class Scheduler(Service):
    name = "scheduler"

    def __init__(
        self,
        schedules: list[Schedule],
        stats: Stats,
        *,
        interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.schedules = schedules
        self.stats = stats
        self.interval = interval_seconds
        self.clock = clock
        self.looked_until: dict[str, datetime] = {}

    def run(self) -> None:
        while not self.stopping:
            self.look(datetime.fromtimestamp(self.clock(), UTC))
            # Wake just after the next whole second: per-second schedules
            # are enqueued within a few ms of their tick.
            now = self.clock()
            self._stop.wait(self.interval - (now % self.interval) + 0.005)

    def finished(self) -> None:
        connections.close_all()  # this thread's Django connection

    def look(self, now: datetime) -> int:
        """Enqueue every schedule's ticks due by ``now``; returns how many were offered."""
        offered = 0
        floor = now - timedelta(seconds=CATCH_UP_SECONDS)
        for schedule in self.schedules:
            first_look = schedule.name not in self.looked_until
            after = max(self.looked_until.get(schedule.name, floor), floor)
            try:
                for tick in due_ticks(schedule, after, now, limit=1 if first_look else MAX_TICKS_PER_LOOK):
                    schedule.unique_task(tick).enqueue(*schedule.args, **schedule.kwargs)
                    offered += 1
                    after = tick
            except DatabaseError as exc:
                # Retried at the next look (the ticks stay due until they are
                # older than the catch-up window).
                self.stats.add("db_errors")
                logger.warning("periodic %s: could not enqueue its tick (%s); retrying", schedule.name, exc)
                close_old_connections()
                self.looked_until[schedule.name] = after
                continue
            self.looked_until[schedule.name] = now
        if offered:
            self.stats.add("ticks", offered)
        return offered
