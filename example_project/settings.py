"""Settings of the example project: everything comes from the environment.

``DATABASE_URL`` picks the PostgreSQL server; when it is unset an embedded
server (``pgserver``) is started under ``BASE_DIR/.pgdata/`` (or
``$SHARDQ_PGDATA``) and its URL exported, so
child processes (gunicorn, workers) join the same server.
``SHARDQ_*`` variables tune shardq (see docs/configuration.md).
"""

import os
import re
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()


def database_from_url(url: str) -> dict:
    """``DATABASE_URL`` as a DATABASES entry; a value django-environ cannot
    read as a database URL ("notaurl", a missing "://", an unknown scheme)
    is an error that says so, not a later "database 'default' is unknown"
    (a URL of another database is shardq's check E001 to refuse)."""
    config = environ.Env.db_url_config(url) if "://" in url else {}
    if config.get("ENGINE") not in environ.Env.DB_SCHEMES.values():
        shown = re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)  # no password in the message
        raise ImproperlyConfigured(
            f"DATABASE_URL={shown!r} is unparsable as a database URL: write "
            "postgres://USER:PASSWORD@HOST:PORT/NAME (or leave DATABASE_URL unset for the embedded server)."
        )
    return config


if not os.environ.get("DATABASE_URL"):
    from shardq import embedded

    # Child processes inherit the URL and join the server. Whoever started it
    # stops it when it exits (a command that only joined a running server
    # leaves it running); SHARDQ_EMBEDDED_STARTED_BY names that process.
    os.environ["DATABASE_URL"] = embedded.start(embedded.data_dir(BASE_DIR), stop_at_exit=True)
    if embedded.started_here():
        os.environ["SHARDQ_EMBEDDED_STARTED_BY"] = str(os.getpid())

SECRET_KEY = env("DJANGO_SECRET_KEY", default="insecure-example-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "shardq",
    "example_project.demo",
    *env.list("DJANGO_EXTRA_APPS", default=[]),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The admin's static files under gunicorn with DEBUG off (no web server in front).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # X-Frame-Options: DENY (Django's default X_FRAME_OPTIONS): no page is framed.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
# WhiteNoise serves straight from the apps' static folders, so the example
# runs without a collectstatic step; a production project sets STATIC_ROOT,
# runs collectstatic and leaves this False.
WHITENOISE_USE_FINDERS = True
LOGIN_URL = "admin:login"

TASKS = {
    "default": {
        "BACKEND": "shardq.backend.ShardqBackend",
        "QUEUES": env.list("SHARDQ_QUEUES", default=["default", "emails", "reports"]),
    }
}

SHARDQ = {
    "SHARD_COUNT": env.int("SHARDQ_SHARD_COUNT", default=64),
    "LEASE_TTL": env.float("SHARDQ_LEASE_TTL", default=30.0),
    "HEARTBEAT": env.float("SHARDQ_HEARTBEAT", default=10.0),
    "POLL_INTERVAL": env.float("SHARDQ_POLL_INTERVAL", default=1.0),
    "NOTIFY": env.bool("SHARDQ_NOTIFY", default=True),
    # A SIGKILLed worker's shards are taken over in a fraction of a second,
    # not after LEASE_TTL (docs/reliability.md, "A worker that dies").
    "DEAD_OWNER_DETECTION": env.bool("SHARDQ_DEAD_OWNER_DETECTION", default=True),
    "DEAD_OWNER_CHECK": env.float("SHARDQ_DEAD_OWNER_CHECK", default=0.1),
    # This web process counts its enqueues and cancels for /metrics/
    # (docs/operations.md, "Metrics"); None: wherever metrics are on (METRICS_PORT).
    "ENQUEUE_METRICS": env.bool("SHARDQ_ENQUEUE_METRICS", default=None),
}
# The bearer token a Prometheus scraper sends to /metrics/ (views.staff_or_token).
METRICS_TOKEN = env("METRICS_TOKEN", default="")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("DJANGO_LOG_LEVEL", default="WARNING")},
    "loggers": {
        "django.tasks": {"level": env("SHARDQ_TASK_LOG_LEVEL", default="WARNING")},
        "shardq": {"level": env("SHARDQ_LOG_LEVEL", default="INFO")},
    },
}
