"""The scale tests' PostgreSQL: tests/pgserver.py's private cluster, migrated,
with a role ``observer`` for the test's own statements (told apart from the
workers' in pg_stat_statements), and optionally listening on more addresses
(the host ends of veth links) that log in without a password. The shared
server is never touched."""

import os
import subprocess
import sys

import psycopg

from tests.pgserver import PrivatePostgres
from tests.workers import ROOT

DATABASE = "shardq_scale"


class ScalePostgres(PrivatePostgres):
    def __init__(
        self,
        listen: tuple[str, ...] = ("127.0.0.1",),
        settings: dict[str, str] | None = None,
        trust_networks: tuple[str, ...] = (),
    ):
        # 16 workers hold 5-7 connections each.
        super().__init__("scale", DATABASE, settings={"max_connections": "300", **(settings or {})})
        # Given after PrivatePostgres's own listen_addresses on pg_ctl's
        # command line: the later -c of a setting wins.
        self.settings["listen_addresses"] = ",".join(listen)
        self.trust_networks = trust_networks

    def url_for(self, host: str = "127.0.0.1", user: str = "postgres") -> str:
        return f"postgres://{user}@{host}:{self.port}/{DATABASE}"

    def prepare(self) -> None:
        """initdb, start, create and migrate the database, create ``observer``."""
        self.init()
        with open(self.data / "pg_hba.conf", "a") as hba:
            for network in self.trust_networks:
                hba.write(f"host all all {network} trust\n")
        self.start()
        with psycopg.connect(self.url_for().rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            conn.execute("CREATE ROLE observer LOGIN SUPERUSER")
        env = dict(os.environ, DATABASE_URL=self.url_for(), DJANGO_SETTINGS_MODULE="tests.settings")
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300
        )
