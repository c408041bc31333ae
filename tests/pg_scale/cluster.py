"""A private, throwaway PostgreSQL cluster that a test may stop, crash and restart.

The shared server on 127.0.0.1:5432 is never touched: the cluster is created with
``initdb`` (as the ``postgres`` OS user, which PostgreSQL requires) in a fresh temporary
folder, listens on 127.0.0.1 on a free port with its socket in that folder, and is
stopped and deleted when the test ends, whatever happened.

    with PrivateCluster.create() as cluster:
        url = cluster.url("postgres")
        cluster.stop("fast")        # or "immediate": a crash, recovered on the next start
        cluster.start()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

import psycopg

__all__ = ["ClusterUnavailable", "PrivateCluster", "find_bindir"]

OS_USER = "postgres"  # initdb refuses to run as root
START_TIMEOUT = 60  # seconds pg_ctl waits for the server to start or stop
CONNECT_TIMEOUT = 30.0  # seconds to wait until the started server takes connections
PORT_TRIES = 5  # first starts on a fresh port before giving up on finding one


class ClusterUnavailable(RuntimeError):
    """This machine cannot make a private cluster (no initdb, no postgres user, not root)."""


def find_bindir() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``: ``$KEEL_TEST_PG_BINDIR``, ``pg_config
    --bindir``, or the newest ``/usr/lib/postgresql/*/bin``."""
    candidates: list[str] = []
    if env := os.environ.get("KEEL_TEST_PG_BINDIR"):
        candidates.append(env)
    if pg_config := shutil.which("pg_config"):
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(out.stdout.strip())
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    candidates.extend(versions)
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    raise ClusterUnavailable("no initdb/pg_ctl found (set KEEL_TEST_PG_BINDIR)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One throwaway cluster: its folder, port and server process (via ``pg_ctl``)."""

    def __init__(self, folder: Path, bindir: Path, port: int) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "server.log"
        self.bindir = bindir
        self.port = port
        self.host = "127.0.0.1"

    @classmethod
    def create(cls, *, max_connections: int = 80) -> PrivateCluster:
        """initdb a new cluster in a fresh temporary folder and start it.

        Raises:
            ClusterUnavailable: not root, no ``postgres`` user, or no initdb.
        """
        if os.geteuid() != 0:
            raise ClusterUnavailable("making a cluster as the postgres user needs root")
        try:
            user = pwd.getpwnam(OS_USER)
        except KeyError:
            raise ClusterUnavailable(f"no {OS_USER!r} OS user") from None
        bindir = find_bindir()
        # Not under pytest's tmp_path: its parents are root's 0700 folders, which the
        # postgres user could not enter. mkdtemp makes a 0700 folder in /tmp, given to it.
        folder = Path(tempfile.mkdtemp(prefix="keel-pg-cluster-"))
        os.chown(folder, user.pw_uid, user.pw_gid)
        cluster = cls(folder, bindir, _free_port())
        try:
            cluster._as_postgres(
                str(bindir / "initdb"),
                "-D", str(cluster.data),
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",  # a throwaway cluster: the OS crashing is not what we test
            )  # fmt: skip
            with (cluster.data / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"\nlisten_addresses = '{cluster.host}'\n"
                    f"unix_socket_directories = '{folder}'\n"
                    f"max_connections = {max_connections}\n"
                    "shared_buffers = 32MB\n"
                    "fsync = on\n"
                    "synchronous_commit = on\n"
                )
            cluster._start_on_a_free_port()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def _as_postgres(self, *argv: str) -> str:
        out = subprocess.run(
            ["runuser", "-u", OS_USER, "--", *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT + 30,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}\n"
                + self.server_log()
            )
        return out.stdout

    def url(self, dbname: str = "postgres", **options: str) -> str:
        """A URL of this cluster (TCP on the loopback address), with query options."""
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"postgresql://postgres@{self.host}:{self.port}/{dbname}" + (
            f"?{query}" if query else ""
        )

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def start(self) -> None:
        """Start the server and wait until it takes connections."""
        self._as_postgres(
            str(self.bindir / "pg_ctl"),
            "-D", str(self.data),
            "-l", str(self.log),
            "-w", "-t", str(START_TIMEOUT),
            "start",
        )  # fmt: skip
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _start_on_a_free_port(self) -> None:
        """The first start: on :attr:`port`, or, if another process took it (it was
        picked free and released for the server to bind), on another, at most
        :data:`PORT_TRIES` times."""
        for start in range(1, PORT_TRIES + 1):
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(f"port = {self.port}\n")  # the last setting in the file wins
            since = self.log.stat().st_size if self.log.exists() else 0
            try:
                self.start()
                return
            except RuntimeError:
                with self.log.open("rb") as log:
                    log.seek(since)
                    taken = b"address already in use" in log.read().lower()
                if not taken or start == PORT_TRIES:
                    raise
            self.port = _free_port()

    def stop(self, mode: Literal["smart", "fast", "immediate"] = "fast") -> None:
        """Stop the server: ``fast`` ends every session (clients see admin_shutdown);
        ``immediate`` is a crash (no checkpoint; the next start recovers from the WAL)."""
        self._as_postgres(
            str(self.bindir / "pg_ctl"),
            "-D", str(self.data),
            "-m", mode,
            "-w", "-t", str(START_TIMEOUT),
            "stop",
        )  # fmt: skip

    def server_log(self) -> str:
        """The end of the server's log (for failure messages)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- private cluster log ---\n{text[-3000:]}"

    def destroy(self) -> None:
        """Stop the server if it runs (immediately) and delete the folder."""
        try:
            if self.running:
                try:
                    self.stop("immediate")
                except (RuntimeError, subprocess.TimeoutExpired):
                    self._kill_postmaster()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        """SIGQUIT (PostgreSQL's immediate shutdown) to this cluster's own postmaster,
        by the pid in its lock file: for when pg_ctl could not stop it."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)

    def __enter__(self) -> PrivateCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
