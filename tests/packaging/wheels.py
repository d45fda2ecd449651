"""Helpers of the packaging tests: build shardq's wheel from a copy of the
checkout, and give a fresh virtualenv exactly the wheel's dependencies,
linked from this environment (no download)."""

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import psycopg
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
# Never copied into the build: the local environment and build leftovers
# (a stale build/lib would put removed modules back into the wheel).
IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".pgdata",
    ".demo",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    "results",
    ".pytest_cache",
    ".hypothesis",
)


def run(*args, cwd=None, env=None, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def server_settings() -> dict:
    """The test server's connection settings (DATABASE_URL, or the embedded one)."""
    from django.db import connections

    s = connections["default"].settings_dict
    return {"USER": s["USER"], "PASSWORD": s["PASSWORD"], "HOST": s["HOST"], "PORT": s["PORT"]}


def admin_connection(server: dict, dbname: str = "postgres") -> psycopg.Connection:
    params = {
        "dbname": dbname,
        "user": server["USER"],
        "password": server["PASSWORD"],
        "host": server["HOST"],
        "port": server["PORT"],
    }
    return psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True)


def dependency_closure(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` need, recursively, as installed in
    this test run's environment: a requirement's extras (``psycopg[binary]``)
    bring what the distribution requires for them; extras not asked for bring nothing."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [(Requirement(r), frozenset({""})) for r in requirements]
    while todo:
        req, extras = todo.pop()
        # A marker's `extra` is the parent's: true for any extra asked of it.
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(req.name)
        asked = frozenset({"", *req.extras})
        if (name, asked) in seen:
            continue
        seen.add((name, asked))
        names.add(name)
        todo.extend((Requirement(r), asked) for r in (metadata.distribution(name).requires or []))
    return names


def link_dependencies(names: set[str], target: Path) -> None:
    """Symlink exactly the files of ``names`` (packages, modules, native
    libraries, their dist-info) into ``target``: the fresh venv sees its
    dependencies and nothing else of this environment, with no download."""
    target.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        tops = {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}
        for top in tops:
            source = Path(dist.locate_file(top))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)


def build_wheel(source_parent: Path, out: Path) -> Path:
    """shardq's wheel, built from a copy of the checkout (in ``source_parent/shardq``) into ``out``."""
    source = source_parent / "shardq"
    shutil.copytree(REPO, source, ignore=IGNORE)
    # The dev environment's setuptools: an isolated build would install it afresh.
    run(
        sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", out, source
    )
    (built,) = out.glob("shardq-*.whl")
    return built


def wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(zf.read(meta).decode())
