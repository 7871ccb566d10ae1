"""A throwaway local PostgreSQL server for the team-ledger tests and CI (standard library only).

Used by ``.ci/run`` before the virtual environment exists (``python3 tests/pg_cluster.py start``)
and by the server-restart test, which needs a private server it may restart without disturbing
tests running in parallel on the shared one.

The server listens only on the loopback interface: ``listen_addresses = '127.0.0.1'`` plus a
unix socket inside the cluster's own directory; password authentication (scram-sha-256) over
TCP, peer authentication on the socket. It runs as the ``postgres`` system user when started by
root (``initdb`` refuses to run as root), otherwise as the calling user.

Commands::

    python3 tests/pg_cluster.py start DIR [--install]   # prints postgresql://postgres:PW@127.0.0.1:PORT/dpaudit_test
    python3 tests/pg_cluster.py restart DIR
    python3 tests/pg_cluster.py stop DIR                # stops the server and removes DIR
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
DATABASE = "dpaudit_test"
SUPERUSER = "postgres"
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    pass


def find_bindir() -> Path | None:
    """The directory of initdb / pg_ctl / postgres: Debian's newest /usr/lib/postgresql/N/bin, else PATH."""
    cands = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
    )
    for c in reversed(cands):
        if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    return None


def install() -> None:
    """Install Debian's ``postgresql`` package (CI only; needs root and the package mirror)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def _server_user() -> str | None:
    """``postgres`` when we are root (the server must not run as root), else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise ClusterError(
            "running as root but there is no 'postgres' system user to run the server as"
        ) from None
    return SUPERUSER


def _as_server_user(cmd: list[str]) -> list[str]:
    user = _server_user()
    return cmd if user is None else ["runuser", "-u", user, "--", *cmd]


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(_as_server_user(cmd), capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise ClusterError(f"{Path(cmd[0]).name} failed (exit {r.returncode}): {' | '.join(tail)}")
    return r


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _chown(path: Path) -> None:
    user = _server_user()
    if user is not None:
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _state(root: Path) -> dict:
    try:
        return json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError):
        raise ClusterError(f"{root} holds no cluster started by pg_cluster.py") from None


def url(root: Path, database: str = DATABASE) -> str:
    st = _state(root)
    return f"postgresql://{SUPERUSER}:{st['password']}@{LOOPBACK}:{st['port']}/{database}"


def start(
    root: Path, *, port: int | None = None, allow_install: bool = False, timeout_s: float = 60.0
) -> str:
    """initdb + start a server in ``root`` (created; must be empty) and create the test database."""
    bindir = find_bindir()
    if bindir is None and allow_install:
        install()
        bindir = find_bindir()
    if bindir is None:
        raise ClusterError(
            "PostgreSQL server binaries (initdb, pg_ctl) not found; install Debian's 'postgresql' package"
        )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    _chown(root)
    data, sock = root / "data", root / "sock"
    sock.mkdir(exist_ok=True)
    _chown(sock)
    password = secrets.token_hex(16)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    pwfile.chmod(0o600)
    _chown(pwfile)
    _run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            SUPERUSER,
            "--pwfile",
            str(pwfile),
            "-E",
            "UTF8",
            "--no-locale",
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
        ]
    )
    pwfile.unlink()
    port = port or free_loopback_port()
    with open(data / "postgresql.conf", "a") as f:
        # Loopback only: nothing listens on any other interface.
        f.write(
            f"\nlisten_addresses = '{LOOPBACK}'\nport = {port}\nunix_socket_directories = '{sock}'\n"
        )
    (root / STATE_FILE).write_text(
        json.dumps({"bindir": str(bindir), "port": port, "password": password})
    )
    _pg_ctl(root, "start", timeout_s)
    _psql(root, "postgres", f"CREATE DATABASE {DATABASE}")
    return url(root)


def _pg_ctl(root: Path, action: str, timeout_s: float = 60.0) -> None:
    st = _state(root)
    cmd = [
        str(Path(st["bindir"]) / "pg_ctl"),
        "-D",
        str(root / "data"),
        "-w",
        "-t",
        str(int(timeout_s)),
        "-l",
        str(root / "server.log"),
    ]
    if action in ("stop", "restart"):
        cmd += ["-m", "fast"]
    _run(cmd + [action])


def _psql(root: Path, database: str, sql: str) -> str:
    st = _state(root)
    psql = Path(st["bindir"]) / "psql"
    r = _run(
        [
            str(psql),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            str(root / "sock"),
            "-p",
            str(st["port"]),
            "-U",
            SUPERUSER,
            "-d",
            database,
            "-c",
            sql,
        ]
    )
    return r.stdout


def restart(root: Path) -> None:
    _pg_ctl(Path(root), "restart")


def stop(root: Path) -> None:
    """Stop the server (if running) and remove ``root``."""
    root = Path(root)
    try:
        _pg_ctl(root, "stop")
    except ClusterError as e:
        if (
            "no server running" not in str(e).lower()
            and (root / "data" / "postmaster.pid").exists()
        ):
            raise
    shutil.rmtree(root, ignore_errors=True)


def wait_ready(root: Path, timeout_s: float = 30.0) -> None:
    st = _state(Path(root))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((LOOPBACK, st["port"]), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise ClusterError(f"server on {LOOPBACK}:{st['port']} did not come up") from None
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("start", "restart", "stop", "url"))
    ap.add_argument("dir", type=Path)
    ap.add_argument(
        "--install",
        action="store_true",
        help="apt-get install postgresql if the binaries are missing",
    )
    ap.add_argument("--port", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        if a.action == "start":
            print(start(a.dir, port=a.port, allow_install=a.install))
        elif a.action == "restart":
            restart(a.dir)
        elif a.action == "stop":
            stop(a.dir)
        else:
            print(url(a.dir))
    except (ClusterError, OSError, subprocess.CalledProcessError) as e:
        print(f"pg_cluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
