"""PostgreSQL fixtures for the team-ledger tests.

``$DPAUDIT_TEST_POSTGRES`` (set by ``.ci/run``) is a superuser URL of a throwaway server on
127.0.0.1. Without it the PostgreSQL tests skip with a visible reason -- except in CI
(``$CI`` or ``$DPAUDIT_REQUIRE_POSTGRES`` set), where a missing or unreachable server is a failure: the team ledger must be
tested on a real server there.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

PG_ENV = "DPAUDIT_TEST_POSTGRES"
_CLUSTER_HELPER = Path(__file__).resolve().parents[1] / "pg_cluster.py"


def in_ci() -> bool:
    """``$CI`` (set by CI services) or ``$DPAUDIT_REQUIRE_POSTGRES`` (set by .ci/run) is set."""
    return any(
        os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
        for v in ("CI", "DPAUDIT_REQUIRE_POSTGRES")
    )


def missing(reason: str):
    """Skip (visibly) on a developer machine; fail in CI."""
    if in_ci():
        pytest.fail(
            f"CI must provide a PostgreSQL server for the team-ledger tests: {reason}",
            pytrace=False,
        )
    pytest.skip(reason)


def load_cluster_helper():
    """tests/pg_cluster.py as a module (it is also a stand-alone script for .ci/run)."""
    import importlib.util

    if "dpaudit_pg_cluster" in sys.modules:
        return sys.modules["dpaudit_pg_cluster"]
    spec = importlib.util.spec_from_file_location("dpaudit_pg_cluster", _CLUSTER_HELPER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dpaudit_pg_cluster"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The superuser URL of the test server (skip / fail as described above)."""
    url = os.environ.get(PG_ENV)
    if not url:
        missing(
            f"no PostgreSQL test server: set {PG_ENV}=postgresql://USER:PW@127.0.0.1:PORT/DB (.ci/run starts one)"
        )
    try:
        import psycopg
    except ImportError:
        missing("psycopg (version 3) is not installed")
    try:
        with psycopg.connect(url, connect_timeout=5) as c:
            c.execute("SELECT 1")
    except psycopg.Error as e:
        missing(
            f"PostgreSQL test server in ${PG_ENV} is unreachable: {str(e).strip().splitlines()[0]}"
        )
    return url


def with_schema(url: str, schema: str) -> str:
    return url + ("&" if "?" in url else "?") + f"schema={schema}"


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_schema(pg_server_url):
    """A fresh, unique schema name; dropped after the test."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(pg_server_url, name)


@pytest.fixture
def pg_ledger_url(pg_server_url, pg_schema) -> str:
    """A ``postgresql://...?schema=t_...`` ledger URL of its own for this test."""
    return with_schema(pg_server_url, pg_schema)


@pytest.fixture
def pg_role(pg_server_url):
    """``(name, password, url)`` of a fresh LOGIN role with no privileges; dropped after the test."""
    import urllib.parse

    import psycopg

    name = f"w_{uuid.uuid4().hex[:12]}"
    pw = uuid.uuid4().hex
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{pw}'")
    parts = urllib.parse.urlsplit(pg_server_url)
    url = urllib.parse.urlunsplit(
        parts._replace(netloc=f"{name}:{pw}@{parts.hostname}:{parts.port}")
    )
    yield name, pw, url
    with psycopg.connect(pg_server_url, autocommit=True) as c:
        # Terminate its sessions first (a test may leave one open on failure).
        c.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        c.execute(f"DROP OWNED BY {name} CASCADE")
        c.execute(f"DROP ROLE {name}")


@pytest.fixture
def private_pg_cluster(tmp_path_factory):
    """A private throwaway server (loopback only) that a test may restart; stopped and removed after."""
    helper = load_cluster_helper()
    if helper.find_bindir() is None:
        missing(
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's 'postgresql' package"
        )
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            missing("running as root without a 'postgres' system user to run a private server as")
    root = Path(f"/tmp/dpaudit-pg-{uuid.uuid4().hex[:10]}")
    try:
        url = helper.start(root)
    except helper.ClusterError as e:
        helper.stop(root)
        missing(f"cannot start a private PostgreSQL server: {e}")
    try:
        yield helper, root, url
    finally:
        helper.stop(root)


@pytest.fixture(autouse=True)
def _no_personal_signing_key(tmp_path_factory, monkeypatch):
    """Tests never pick up the developer's own signing key (~/.config/dpaudit/keys/default.key)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    monkeypatch.delenv("DPAUDIT_SIGNING_KEY", raising=False)
