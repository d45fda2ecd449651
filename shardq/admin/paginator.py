"""A paginator that never counts a huge table: the admin's job list at ten
million rows (docs/admin.md, "At ten million jobs").

Django's paginator runs ``SELECT COUNT(*)`` over everything the list's
filters match, which at millions of rows reads them all (seconds). This one
asks PostgreSQL's planner first (``EXPLAIN``: its row estimate from the
table's statistics, no rows read); only when the estimate is small
(≤ ``EXACT_BELOW``) does it count, and then a bounded count
(``LIMIT EXACT_BELOW + 1``) that stops early whatever the estimate missed,
in the list's own order (newest first), so it walks the rows the page's own
query walks rather than the whole table.
A count that is an estimate is marked (``estimated``), and the page says
"about N jobs".
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
        estimate = estimated_rows(queryset)
        if estimate is not None and estimate > EXACT_BELOW:
            self.estimated = True
            return estimate
        # Sliced, the count keeps the list's ordering (Django clears it
        # only from an unsliced query).
        bounded = queryset.values("pk")[: EXACT_BELOW + 1].count()
        if bounded > EXACT_BELOW:
            # More than the estimate said: at least this many.
            self.estimated = True
            return max(bounded, estimate or 0)
        return bounded
