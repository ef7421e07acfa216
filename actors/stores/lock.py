"""Ownership of a home: one runtime at a time, held by an OS file lock that a crash releases.

A runtime takes an exclusive ``flock`` on ``<home>/loopd.lock`` when it starts and lets it go
when it stops. The kernel drops the lock when the process dies, however it dies, so a crash
never leaves a home locked. The file also holds the pid of the holder, so the error a second
runtime gets can say who holds it. Readers (``loopd sessions``) take no lock: the store's WAL
lets them read while the runtime writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_NAME", "HomeInUse", "HomeLock"]

LOCK_NAME = "loopd.lock"
"""The lock file's name under ``home``."""


class HomeInUse(RuntimeError):
    """Another runtime holds this home. ``home`` is the home and ``pid`` the holder's (None if
    the lock file does not say)."""

    def __init__(self, home: Path, pid: int | None) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not recorded"
        super().__init__(
            f"the home {home} is in use by another loopd runtime ({holder}); stop that runtime "
            "or give this one another home (see docs/runbook.md#home-in-use)"
        )
        self.home = home
        self.pid = pid


class HomeLock:
    """The lock of one home, held from :meth:`acquire` until :meth:`release`."""

    def __init__(self, home: Path, fd: int) -> None:
        self.home = home
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, home: str | Path) -> HomeLock:
        """Lock ``home`` (which must exist) for this process, or raise :class:`HomeInUse`.

        A second lock of the same home in the same process is refused too: flock locks belong
        to an open file, not to a process.
        """
        home = Path(home)
        path = home / LOCK_NAME
        # O_CLOEXEC: a tool the runtime starts must not inherit (and so keep) the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise HomeInUse(home, pid) from None
        except BaseException:
            os.close(fd)
            raise
        data = f"{os.getpid()}\n".encode()
        # Write in place, then cut: a reader never sees an empty file between two holders.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        return cls(home, fd)

    @property
    def held(self) -> bool:
        """True until :meth:`release`."""
        return self._fd is not None

    def release(self) -> None:
        """Let the home go; safe to call twice. The file stays (removing it would race a new
        holder that has it open)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
