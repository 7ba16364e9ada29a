"""A throwaway PostgreSQL server for the tests of `[data] sql` (fedpeer/data/sources/sql.py).

`postgres_server` (session-scoped; import `postgres_fixture`) runs initdb + pg_ctl from the first
PostgreSQL found: on PATH, Debian's /usr/lib/postgresql/N/bin, or the binaries bundled by pip's
`pgserver` (in the test extra).
The server listens on a free loopback port (password logins, scram-sha-256) and on a unix socket in
its temp dir (the admin's trust login); it is stopped and its directory removed at the end. As root
(CI containers) it runs as `nobody`, as PostgreSQL refuses root. The table `cancer` holds
scikit-learn's breast cancer rows (id = row index), readable by the role `fedsite` whose password
is `PASSWORD`. With no PostgreSQL binaries at all the tests using it are skipped, saying why.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROLE = "fedsite"
PASSWORD = "s3cret-Pw_7z q'x"          # a space and a quote: must survive the DSN and stay out of messages
DBNAME = "hospital"


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    sockdir: Path

    def dsn(self, password: str = PASSWORD, user: str = ROLE, port: int | None = None) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host=self.host, port=port or self.port, dbname=DBNAME, user=user, password=password)

    def admin(self):
        import psycopg

        return psycopg.connect(host=str(self.sockdir), port=self.port, user="postgres", dbname=DBNAME,
                               autocommit=True)


def _bindir() -> Path | None:
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin")
    for d in candidates:
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file() and (d / "postgres").is_file():
            return d
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def breast_cancer_columns() -> list[str]:
    from sklearn.datasets import load_breast_cancer

    return [n.replace(" ", "_") for n in load_breast_cancer().feature_names]


def _load(server: PgServer) -> None:
    import psycopg
    from psycopg import sql
    from sklearn.datasets import load_breast_cancer

    with psycopg.connect(host=str(server.sockdir), port=server.port, user="postgres", dbname="postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DBNAME}")
    ds = load_breast_cancer()
    cols = breast_cancer_columns()
    with server.admin() as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(ROLE), sql.Literal(PASSWORD)))
        conn.execute(sql.SQL("CREATE TABLE cancer (id integer PRIMARY KEY, {}, diagnosis text NOT NULL, "
                             "note text, smoker boolean, grade integer, ratio real)").format(
            sql.SQL(", ").join(sql.SQL("{} double precision").format(sql.Identifier(c)) for c in cols)))
        names = sql.SQL(", ").join(sql.Identifier(c) for c in ["id", *cols, "diagnosis", "note", "smoker", "grade",
                                                                "ratio"])
        with conn.cursor() as cur, cur.copy(sql.SQL("COPY cancer ({}) FROM STDIN").format(names)) as copy:
            for i, (row, target) in enumerate(zip(ds.data, ds.target)):
                copy.write_row([i, *map(float, row), "malignant" if target == 0 else "benign", f"patient {i}",
                                i % 2 == 0, int(target), 0.1 * (i % 7)])
        conn.execute("CREATE TABLE secrets (x integer)")      # fedsite may not read it
        conn.execute("CREATE SEQUENCE tickets")                # nextval() writes: refused read-only
        conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE tickets TO {}").format(sql.Identifier(ROLE)))
        conn.execute(sql.SQL("GRANT SELECT ON cancer TO {}").format(sql.Identifier(ROLE)))


def _start(base: Path, bindir: Path) -> PgServer:
    as_user: dict = {}
    if os.geteuid() == 0:
        as_user = {"user": "nobody", "group": "nogroup" if _has_group("nogroup") else "nobody", "extra_groups": []}
    pgdata, sockdir = base / "data", base / "sock"
    for d in (pgdata, sockdir):
        d.mkdir(mode=0o700)
        if as_user:
            shutil.chown(d, as_user["user"], as_user["group"])
    base.chmod(0o755)
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
    run = {"check": True, "capture_output": True, "text": True, "env": env, "timeout": 60, "cwd": base, **as_user}
    subprocess.run([str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust",
                    "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync"], **run)
    for _attempt in range(5):
        port = _free_port()
        opts = f"-h 127.0.0.1 -p {port} -k {sockdir} -c fsync=off -c synchronous_commit=off -c max_connections=40"
        r = subprocess.run([str(bindir / "pg_ctl"), "-D", str(pgdata), "-o", opts, "-l", str(pgdata / "server.log"),
                            "-w", "-t", "30", "start"], **{**run, "check": False})
        if r.returncode == 0:
            return PgServer("127.0.0.1", port, sockdir)
    raise RuntimeError(f"pg_ctl start failed: {r.stderr}\n{r.stdout}")


def _has_group(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def _stop(base: Path, bindir: Path) -> None:
    as_user = {"user": "nobody", "group": "nogroup" if _has_group("nogroup") else "nobody",
               "extra_groups": []} if os.geteuid() == 0 else {}
    subprocess.run([str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "-w", "stop"],
                   capture_output=True, timeout=60, cwd=base, **as_user)


@pytest.fixture(scope="session", name="postgres_server")
def postgres_fixture() -> Iterator[PgServer]:
    """The server (import `postgres_fixture` into a test module; tests ask for `postgres_server`)."""
    bindir = _bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries: neither initdb on PATH, /usr/lib/postgresql/*/bin, nor pip's "
                    "pgserver (pip install -e '.[test]' installs it)")
    base = Path(tempfile.mkdtemp(prefix="fedpeer-pg-"))
    try:
        server = _start(base, bindir)
        try:
            _load(server)
            yield server
        finally:
            _stop(base, bindir)
    finally:
        shutil.rmtree(base, ignore_errors=True)
