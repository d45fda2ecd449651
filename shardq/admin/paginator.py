"""A paginator that never counts a huge table: the admin's job list and job
history at ten million rows (docs/admin.md, "At ten million jobs"); the one
paginator of both (the history's own, which counted up to 10,000 rows, is
gone).

Django's paginator runs ``SELECT COUNT(*)`` over everything the list's
filters match, which at millions of rows reads them all (seconds). This one
counts at most ``EXACT_BELOW + 1`` rows (``LIMIT``), in the list's own
order (newest first), so it walks the rows the page's own query walks
rather than the whole table: when that count stops short of the bound, it
is exact. Only past the bound does it ask PostgreSQL's planner (``EXPLAIN``:
its row estimate from the table's statistics, no rows read). The bounded
count comes first because statistics go stale: after the archiver or a
prune deleted most of the table, and before autovacuum analyzes it, the
planner still estimates the old size, and a list of 1 job would read
"about 20,000 jobs" over 200 empty pages.
A count that is an estimate is marked (``estimated``), and the page says
"about N jobs" (admin/shardq/pagination.html, every shardq list's).
"""

import json

from django.core.paginator import Paginator
from django.db import connections
from django.utils.functional import cached_property

#: Below this many rows (estimated), the count is exact.
EXACT_BELOW = 1000


def estimated_rows(queryset) -> int | None:
    """The planner's row estimate for ``queryset`` (EXPLAIN, nothing run),
    or None when it cannot say (not PostgreSQL)."""
    if connections[queryset.db].vendor != "postgresql":
        return None
    document = queryset.values("pk").order_by().explain(format="json")
    plan = json.loads(document) if isinstance(document, str) else document
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatedCountPaginator(Paginator):
    """Paginator whose ``count`` is exact up to EXACT_BELOW rows and the
    planner's estimate beyond (``estimated`` is then True)."""

    estimated = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        # Sliced, the count keeps the list's ordering (Django clears it
        # only from an unsliced query).
        bounded = queryset.values("pk")[: EXACT_BELOW + 1].count()
        if bounded <= EXACT_BELOW:
            return bounded
        # At least this many: the planner's estimate, if it says more.
        self.estimated = True
        return max(bounded, estimated_rows(queryset) or 0)
