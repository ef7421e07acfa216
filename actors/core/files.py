"""Reading the files a user points loopd at: only regular files, never more than a cap.

A path in a config (the config file itself, ``MEMORY.md``, ``HEARTBEAT.md``) may name a FIFO, a
device, a directory or a file that never ends. Opening a FIFO for reading blocks until someone
writes; ``/dev/zero`` never ends. So a file is opened without blocking, checked to be a regular
file, and read up to a cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["FileRefused", "file_identity", "read_regular_file"]


class FileRefused(OSError):
    """The path is not a regular file, or it is larger than the cap; the text says which."""


def read_regular_file(path: str | os.PathLike[str], limit: int, *, truncate: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Raises :class:`FileRefused` if ``path`` is not a regular file (a FIFO, a device, a socket, a
    directory), or if it holds more than ``limit`` bytes and ``truncate`` is false; with
    ``truncate`` the first ``limit + 1`` bytes are returned instead, so the caller can tell that
    there was more. Other ``OSError`` (no such file, no permission) pass through.
    """
    where = os.fspath(path)
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of hanging.
    fd = os.open(where, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"{where} is not a regular file (it is {_kind(mode)})")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit and not truncate:
        raise FileRefused(f"{where} is larger than {limit} bytes")
    return data


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def file_identity(path: Path) -> tuple[int, int, int, int] | None:
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of ``path``, or None if it does not exist.

    Equal identities mean, in practice, unchanged contents: a rewrite changes the size or the
    modification time, and a replace (``os.replace``) changes the inode.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
