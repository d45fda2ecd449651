import pytest


@pytest.fixture
def injector(transactional_db, django_db_blocker):
    """An autocommit connection to the test database for fault injectors
    (its own application_name, so the injectors never kill it)."""
    from shardq.db.store import connect

    with django_db_blocker.unblock():
        conn = connect(application_name="faults-injector")
    yield conn
    conn.close()
