"""How to reach the service of a served home: ``<home>/loopd.serve.json``.

``loopd serve --listen`` writes it once its HTTP service answers, beside the home's lock file
(``loopd.lock``): the service's URL, the serving process's pid, and the NAME of the environment
variable its token is read from (never the token). It is readable by the home's owner only
(mode 0600), written whole (a temporary file renamed over it) and removed at a clean stop.

The CLI reads it to go through the service instead of failing with ``HomeInUse``
(actors.shells.client). A file whose process is gone (a crash, a ``kill -9``), or whose pid is
not the one the lock file names, is stale and ignored.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import msgspec

from actors.stores.lock import LOCK_NAME

__all__ = ["SERVED_NAME", "Served", "find_served", "forget_served", "record_served"]

SERVED_NAME = "loopd.serve.json"
"""The file's name under the home."""


class Served(msgspec.Struct, frozen=True):
    """A served home: ``url`` (``http://host:port``), the serving ``pid``, and ``token_env``,
    the variable a client reads the token from (None: the service takes no token)."""

    url: str
    pid: int
    token_env: str | None = None


def _local_url(url: str) -> str:
    """``url`` as a client on this machine reaches it: a wildcard address is loopback."""
    for wildcard, loopback in (("//0.0.0.0:", "//127.0.0.1:"), ("//[::]:", "//[::1]:")):
        url = url.replace(wildcard, loopback, 1)
    return url


def record_served(home: str | Path, url: str, token_env: str | None) -> Path:
    """Write ``home``'s file for this process's service at ``url``; returns its path."""
    path = Path(home) / SERVED_NAME
    data = msgspec.json.encode(Served(_local_url(url), os.getpid(), token_env))
    temporary = path.with_name(f".{SERVED_NAME}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    return path


def forget_served(home: str | Path) -> None:
    """Remove ``home``'s file if this process wrote it (a newer server's file stays)."""
    path = Path(home) / SERVED_NAME
    found = _read(path)
    if found is not None and found.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def find_served(home: str | Path) -> Served | None:
    """The service serving ``home``, or None: no file, an unreadable one, or a stale one (its
    pid is gone, or the lock file names another holder)."""
    home = Path(home)
    found = _read(home / SERVED_NAME)
    if found is None or not _alive(found.pid):
        return None
    try:
        holder = (home / LOCK_NAME).read_text("ascii", "replace").strip()
    except OSError:
        return None
    return found if holder == str(found.pid) else None


def _read(path: Path) -> Served | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=Served)
    except (OSError, msgspec.DecodeError):
        return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True
