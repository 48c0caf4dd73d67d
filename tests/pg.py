"""A real, throw-away PostgreSQL server for tests: Debian's `postgresql` binaries, a cluster made
with `initdb` in a temporary folder, `pg_ctl` listening on 127.0.0.1 only, on a free port.

PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` OS user the
Debian package creates (commands run through `runuser`). Tests get a database and a user that logs
in WITH a password (scram-sha-256 over TCP), so URLs in tests carry a password to be redacted.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

USER, PASSWORD, DB = "moetune", "s3cret-pw-7f2a", "moetune_test"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian layout), or None when absent."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def missing_reason() -> str | None:
    """Why no server can be started here, or None."""
    if bin_dir() is None:
        return "PostgreSQL binaries absent (apt-get install -y postgresql; .ci/run does it)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg absent (pip install -e '.[postgres]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' OS user to own the cluster"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    directory: Path
    port: int
    bin: Path

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{DB}"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)

    def start(self) -> PgServer:
        data = self.directory / "data"
        pwfile = self.directory / "superuser.pw"
        pwfile.write_text("postgres-admin\n")
        if os.geteuid() == 0:
            pg = pwd.getpwnam("postgres")
            os.chown(self.directory, pg.pw_uid, pg.pw_gid)
            os.chown(pwfile, pg.pw_uid, pg.pw_gid)
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8")
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.directory} "
                "-c fsync=off -c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(self.directory / "log"),
                  "-w", "-t", "60", "start")
        self.psql(f"CREATE USER {USER} WITH PASSWORD '{PASSWORD}'")
        self.psql(f"CREATE DATABASE {DB} OWNER {USER}")
        return self

    def psql(self, sql: str, db: str = "postgres") -> str:
        return self._run(str(self.bin / "psql"), "-h", str(self.directory), "-p", str(self.port), "-U", "postgres",
                         "-d", db, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql).stdout

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_server() -> PgServer:
    """Start a server (caller stops it); RuntimeError with PostgreSQL's output when it fails."""
    directory = Path(tempfile.mkdtemp(prefix="moetune-pg-"))
    server = PgServer(directory, _free_port(), bin_dir())
    try:
        return server.start()
    except subprocess.CalledProcessError as e:
        log = (directory / "log").read_text()[-2000:] if (directory / "log").exists() else ""
        server.stop()
        raise RuntimeError(f"PostgreSQL did not start: {e.stderr[-2000:]}{log}") from None
