"""A throwaway PostgreSQL server for tests: the system's ``initdb`` and ``pg_ctl``, a temp dir.

PostgreSQL refuses to run as root, so under uid 0 the server runs as an unprivileged user
(``nobody`` unless ``LOOPD_PG_USER`` names another) in a temp dir that user owns. It listens on
127.0.0.1 on a free port and on a unix socket in that dir; authentication is ``trust``, so the
url carries no password.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

__all__ = ["PostgresServer", "find_pg_bin"]


def _major(folder: Path) -> int:
    name = folder.parent.name
    return int(name) if name.isdigit() else 0


def find_pg_bin() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``: ``LOOPD_PG_BIN``, the PATH, or a known place."""
    named = os.environ.get("LOOPD_PG_BIN")
    candidates = [named] if named else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    # Debian and Ubuntu put each major version in its own folder; the newest first.
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_major, reverse=True)
    candidates += [str(v) for v in versions] + ["/usr/local/bin"]
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """One PostgreSQL cluster in a temp dir: :meth:`start`, :meth:`stop`, :attr:`url`.

    :meth:`stop` and :meth:`start` may be called again (a test of a server that goes away and
    comes back); :meth:`close` stops it for good and removes the dir.
    """

    def __init__(self, bin_dir: Path | None = None) -> None:
        """Find the binaries (or use ``bin_dir``); raises RuntimeError if there are none."""
        found = bin_dir or find_pg_bin()
        if found is None:
            raise RuntimeError(
                "PostgreSQL's initdb/pg_ctl were not found (apt-get install postgresql-15, or "
                "set LOOPD_PG_BIN)"
            )
        self.bin = found
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="loopd-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = os.environ.get("LOOPD_PG_USER", "nobody")
            entry = pwd.getpwnam(self._user)
            os.chmod(self.dir, 0o755)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", "loopd", "--auth=trust", "-E", "UTF8", "--no-sync"
        )

    @property
    def url(self) -> str:
        """The url of the ``postgres`` database as user ``loopd``, over TCP."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        """The url of ``database`` on this server."""
        return f"postgresql://loopd@127.0.0.1:{self.port}/{database}"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> PostgresServer:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self) -> None:
        """Stop the server (fast: open connections are ended) and wait until it has."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def create_database(self, name: str) -> str:
        """Create database ``name`` (letters, digits, ``_``) and return its url."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a plain database name: {name!r}")
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_of(name)

    def close(self) -> None:
        """Stop the server if it runs and remove its dir."""
        with contextlib.suppress(RuntimeError):  # not running
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        """Start it; ``with PostgresServer() as pg:`` closes it at the end."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop it and remove its dir."""
        self.close()
