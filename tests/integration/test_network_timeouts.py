"""Worker connections carry network timeouts tied to the lease TTL (issue 17
part 2: on a silent partition a statement otherwise waits ~15 minutes for the
kernel's TCP retransmission limit); a project's own OPTIONS win."""

from django.db import connections
from django.test import override_settings

from shardq.db.store import connect, network_timeouts


def parameters(**options) -> dict[str, str]:
    settings = connections["default"].settings_dict
    saved = dict(settings.get("OPTIONS", {}))
    settings["OPTIONS"] = {**saved, **options}
    try:
        with connect() as conn:
            return conn.info.get_parameters()
    finally:
        settings["OPTIONS"] = saved


def test_worker_connections_give_up_on_a_silent_link_within_a_third_of_the_lease_ttl(db):
    with override_settings(SHARDQ={"LEASE_TTL": 30, "HEARTBEAT": 10}):
        got = parameters()
    assert got["tcp_user_timeout"] == "10000"
    assert got["connect_timeout"] == "10"
    assert (got["keepalives"], got["keepalives_idle"], got["keepalives_interval"], got["keepalives_count"]) == (
        "1",
        "10",
        "3",
        "3",
    )


def test_a_short_ttl_keeps_the_timeouts_at_their_floors():
    assert network_timeouts(2.0) == {
        "connect_timeout": 2,
        "tcp_user_timeout": 1000,
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }


def test_a_projects_own_database_options_win(db):
    got = parameters(tcp_user_timeout=1234, keepalives_idle=77)
    assert got["tcp_user_timeout"] == "1234"
    assert got["keepalives_idle"] == "77"
