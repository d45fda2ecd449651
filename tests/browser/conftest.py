"""Fixtures of the admin's browser tests: Playwright drives Debian's chromium
(``/usr/bin/chromium``, installed by ``make test``; never ``playwright
install``) against pytest-django's ``live_server`` (a real HTTP server on
the transactional test database).

The rows the pages show are made the way the system makes them: jobs through
``enqueue``; leases, heartbeats and outcomes with the columns the worker's
statements write (see ``shardq/db/sql/``).
"""

import os
import re

import pytest

from tests.browser.rows import PASSWORD, VIEW_PERMISSIONS, make_user

CHROMIUM = "/usr/bin/chromium"
# This machine's network is closed: without the background-networking flags
# chromium stalls on start-up trying to reach Google's services.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """One chromium a test module.

    Playwright's sync API runs an asyncio event loop in this thread for as
    long as it is started, and Django refuses ORM calls from a thread with a
    running loop (SynchronousOnlyOperation). The tests' ORM calls are plain
    synchronous code, so DJANGO_ALLOW_ASYNC_UNSAFE is set exactly while
    Playwright runs (and put back after), never for the rest of the session.
    """
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"{CHROMIUM} is missing: the admin's browser tests drive Debian's chromium. "
            "`make chromium` (a step of `make test`) installs it with apt-get."
        )
    from playwright.sync_api import sync_playwright

    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if before is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture
def shards(transactional_db):
    """The shard rows (a transactional test's flush may have removed them)."""
    from shardq.db.store import ensure_shards

    ensure_shards()


@pytest.fixture
def superuser(django_user_model, transactional_db):
    return make_user(django_user_model, "operator", superuser=True)


@pytest.fixture
def viewer(django_user_model, transactional_db):
    """Staff who may look at every shardq page but has neither dead-letter permission."""
    return make_user(django_user_model, "viewer", permissions=VIEW_PERMISSIONS)


@pytest.fixture
def retrier(django_user_model, transactional_db):
    """Staff who may retry dead-lettered jobs but not discard them."""
    return make_user(django_user_model, "retrier", permissions=[*VIEW_PERMISSIONS, "retry_job"])


@pytest.fixture
def open_admin(browser, live_server):
    """``open_admin(user)``: a fresh browser context, logged in through the
    admin's login form; returns its page."""
    from playwright.sync_api import expect

    contexts = []

    def open_as(user):
        context = browser.new_context(base_url=live_server.url)
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        page.goto("/admin/login/?next=/admin/")
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("#login-form [type=submit]")
        expect(page).to_have_url(re.compile(r"/admin/$"))
        return page

    yield open_as
    for context in contexts:
        context.close()
