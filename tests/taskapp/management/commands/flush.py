"""The tests' ``flush``: Django's, without the post_migrate signal when the
tests' engine (tests/pgtest/base.py) has put back the rows post_migrate
wrote after migrate. pytest-django ends every transactional test with this
command; the post_migrate that Django's sends would only find every
content type, permission and shard row present (33 SELECTs, about 0.09 s a
test here). With Django's own engine, or a flush that resets sequences or
cascades (the engine's flush is then Django's TRUNCATE and puts nothing
back), it is Django's command unchanged."""

from django.core.management.commands import flush
from django.db import connections


class Command(flush.Command):
    def handle(self, **options):
        ops = connections[options["database"]].ops
        puts_back = getattr(ops, "flush_puts_back_post_migrate_rows", None)
        if puts_back is not None and puts_back(
            # Django's defaults for options left out (manage.py flush resets sequences).
            reset_sequences=options.get("reset_sequences", True),
            allow_cascade=options.get("allow_cascade", False),
        ):
            options["inhibit_post_migrate"] = True
        return super().handle(**options)
