"""Memory: the text every new baseline carries, and the hook told when a session has run."""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import stat
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import Protocol, runtime_checkable

from actors.core.files import FileRefused, file_identity, read_regular_file

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_ENTRY_CHARS",
    "FileMemory",
    "MemoryFailure",
    "MemorySource",
    "check_room",
    "default_memory",
    "entry_text",
    "write_atomically",
]

log = logging.getLogger(__name__)


class MemoryFailure(Exception):
    """The memory source could not produce its block, or could not take an entry; the message
    names what failed."""


@runtime_checkable
class MemorySource(Protocol):
    """Where the memory block of new baselines comes from, and who hears about finished turns.

    A source may also have ``known_block() -> str | None``: the block when giving it reads
    nothing, else None (see :meth:`FileMemory.known_block`). Without it, a turn's session
    that may be stored is always opened first, and memory read only if it is new."""

    def block(self) -> str:
        """The text that goes into every new baseline. May raise (the spawn then fails)."""
        ...

    def updated(self, session: str, turns: int) -> None:
        """``session`` finished a turn and now has ``turns`` turns. Errors are ignored."""
        ...


UPDATES_KEPT = 1000
"""How many ``updated`` calls a FileMemory keeps (the newest), so a long run stays bounded."""

DEFAULT_MAX_CHARS = 64_000
"""``memory.max_chars``: characters of the file a baseline copies."""

DEFAULT_MAX_ENTRY_CHARS = 2_000
"""``memory.max_entry_chars``: characters of one ``remember`` entry."""

_BOM = b"\xef\xbb\xbf"
_UTF8_MAX = 4  # bytes of the longest UTF-8 character


def write_atomically(path: Path, data: bytes) -> None:
    """Make ``data`` the contents of ``path``, all or nothing.

    The bytes go to a temporary file in the same folder, which is synced and then renamed over
    ``path`` (``os.replace``), and the folder is synced. A crash or a full disk at any point
    leaves the old file or the new one, never a mix. A symbolic link at ``path`` is followed:
    its target is replaced. The old file's permissions are kept.
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # not every file system lets a folder be synced
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class FileMemory:
    """A :class:`MemorySource` reading one UTF-8 text file.

    :meth:`block` reads the file only when it changed (its inode, size or modification time),
    so a thousand children of one answer read it once. It copies at most ``max_chars``
    characters, and a damaged file (not valid UTF-8: a write cut off by a crash, say) does not
    stop new sessions: the readable part is used. Either problem is logged once per version of
    the file and kept for :meth:`take_reports`, which the Context turns into events.
    :meth:`remember` writes the whole file anew, atomically.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        max_entry_chars: int = DEFAULT_MAX_ENTRY_CHARS,
    ) -> None:
        """Read from ``path``; it need not exist (yet)."""
        if max_chars < 1 or max_entry_chars < 1:
            raise ValueError("max_chars and max_entry_chars must be >= 1")
        self.path = Path(path)
        self.max_chars = max_chars
        self.max_entry_chars = max_entry_chars
        self._lock = threading.Lock()
        self._updates: deque[tuple[str, int]] = deque(maxlen=UPDATES_KEPT)
        self._cached: tuple[tuple[int, int, int, int], str] | None = None
        self._reports: deque[str] = deque(maxlen=16)
        self.reads = 0
        """How many times the file was actually read (not served from the cache)."""

    # --- reading ---

    def block(self) -> str:
        """The file's text (at most ``max_chars`` characters, then a note); ``""`` when there is
        no file.

        A leading BOM is dropped. Bytes that are not UTF-8 become U+FFFD and the rest is kept. A
        path that is not a regular file (a FIFO, a device, a directory) or cannot be read raises
        :class:`MemoryFailure` naming the path.
        """
        with self._lock:
            try:
                identity = file_identity(self.path)
            except OSError as exc:
                raise MemoryFailure(f"cannot read memory file {self.path}: {exc}") from exc
            if identity is None:
                self._cached = None
                return ""
            if self._cached is not None and self._cached[0] == identity:
                return self._cached[1]
            text = self._read()
            # Cache under the identity seen before the read: a change during it shows next time.
            self._cached = (identity, text)
            return text

    def known_block(self) -> str | None:
        """What :meth:`block` would return if that needs no read of the file, else None.

        ``""`` when there is no file; the text last read when the file is unchanged since (its
        inode, size and modification time: one ``stat``); None when it is new, changed, or
        cannot be looked at. The Context uses it to send a turn's session, which may be stored
        already, its baseline with the first request, without reading memory for a stored
        session.
        """
        with self._lock:
            try:
                identity = file_identity(self.path)
            except OSError:
                return None
            if identity is None:
                return ""
            if self._cached is not None and self._cached[0] == identity:
                return self._cached[1]
            return None

    def _read(self) -> str:
        limit = self.max_chars * _UTF8_MAX + len(_BOM)
        try:
            data = read_regular_file(self.path, limit, truncate=True)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            raise MemoryFailure(f"cannot read memory file {self.path}: {exc}") from exc
        self.reads += 1
        more = len(data) > limit
        data = data[:limit].removeprefix(_BOM)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # final=False when cut: a character split by the cut is not damage.
        text = decoder.decode(data, final=not more)
        damage = _first_damage(data, cut=more)
        if damage is not None:
            self._report(
                f"memory file {self.path} is damaged: not UTF-8 at byte {damage}; "
                "the readable part is used (see docs/runbook.md#memory-file-damaged)"
            )
        if more or len(text) > self.max_chars:
            text = text[: self.max_chars]
            self._report(
                f"memory file {self.path} is longer than memory.max_chars ({self.max_chars} "
                "characters); new baselines copy only its beginning"
            )
            text += (
                f"\n[loopd: the memory file is longer than {self.max_chars} characters; "
                "the rest is left out]\n"
            )
        return text

    def _report(self, text: str) -> None:
        log.warning("%s", text)
        self._reports.append(text)

    def take_reports(self) -> list[str]:
        """The problems found reading the file since the last call (damage, a cut), oldest
        first; each version of the file reports its problems once."""
        with self._lock:
            taken = list(self._reports)
            self._reports.clear()
        return taken

    # --- writing ---

    def remember(self, line: str) -> None:
        """Add ``line`` (one line: newlines become spaces) to the memory file, as ``- <line>``.

        New baselines see it from then on; the baseline of a running session never changes. The
        file is written anew, atomically (:func:`write_atomically`): an interrupted write leaves
        the old file. Raises :class:`MemoryFailure` when the text is empty, longer than
        ``max_entry_chars``, not valid Unicode, when the file would pass ``max_chars``, or when
        the file cannot be read or written.
        """
        text = entry_text(line, self.max_entry_chars)
        entry = f"- {text}\n".encode()  # entry_text made sure it encodes
        with self._lock:
            limit = self.max_chars * _UTF8_MAX + len(_BOM)
            try:
                # truncate: a file past the cap is refused below by what it holds, not by size.
                old = read_regular_file(self.path, limit, truncate=True)
            except FileNotFoundError:
                old = b""
            except FileRefused as exc:
                raise MemoryFailure(f"cannot write memory file {self.path}: {exc}") from exc
            except OSError as exc:
                raise MemoryFailure(f"cannot read memory file {self.path}: {exc}") from exc
            if len(old) > limit:  # more bytes than max_chars characters can take
                check_room(self.max_chars + 1, 0, self.max_chars, "the memory file", self.path)
            used = len(old.removeprefix(_BOM).decode("utf-8", "replace"))
            adds = len(text) + 3  # "- <text>\n"
            if old and not old.endswith(b"\n"):
                old += b"\n"
                adds += 1
            check_room(used, adds, self.max_chars, "the memory file", self.path)
            new = old + entry
            try:
                write_atomically(self.path, new)
            except OSError as exc:
                raise MemoryFailure(f"cannot write memory file {self.path}: {exc}") from exc

    # --- the hook ---

    def updated(self, session: str, turns: int) -> None:
        """Record the call in :attr:`updates` (thread-safe); nothing else, for now."""
        with self._lock:
            self._updates.append((session, turns))

    @property
    def updates(self) -> list[tuple[str, int]]:
        """A copy of the ``(session, turns)`` pairs recorded so far, oldest first."""
        with self._lock:
            return list(self._updates)

    def __repr__(self) -> str:
        return f"FileMemory({str(self.path)!r})"


def entry_text(line: str, max_entry_chars: int) -> str:
    """The entry ``remember`` stores for ``line``: one line, each run of white space (newlines
    too) made one space.

    Raises :class:`MemoryFailure` when it is empty, longer than ``max_entry_chars`` characters,
    or not valid Unicode (a lone surrogate). Every memory source's ``remember`` checks with it.
    """
    text = " ".join(line.split())
    if not text:
        raise MemoryFailure("there is nothing to remember: the text is empty")
    if len(text) > max_entry_chars:
        raise MemoryFailure(
            f"the entry has {len(text)} characters; memory.max_entry_chars allows "
            f"{max_entry_chars}: remember something shorter"
        )
    try:
        text.encode()
    except UnicodeEncodeError:
        raise MemoryFailure("the entry is not valid Unicode text") from None
    return text


def check_room(used: int, entry: int, max_chars: int, what: str, where: object) -> None:
    """Refuse an entry of ``entry`` characters when memory holds ``used`` and may hold
    ``max_chars`` (``memory.max_chars``); ``what`` names the memory (``the memory file``) and
    ``where`` the place an operator makes room in.

    A memory already past the cap is refused as such: new baselines copy only its first
    ``max_chars`` characters, so a line added at its end would reach no new session.
    """
    if used > max_chars:
        raise MemoryFailure(
            f"{what} already holds more than memory.max_chars ({max_chars}) characters; new "
            f"entries would not reach new sessions: an operator must make room in {where}"
        )
    if used + entry > max_chars:
        raise MemoryFailure(
            f"memory is full: {what} would have {used + entry} characters and "
            f"memory.max_chars is {max_chars}; an operator must make room in {where}"
        )


def _first_damage(data: bytes, *, cut: bool) -> int | None:
    """The offset of the first byte of ``data`` that is not UTF-8, or None; with ``cut``, a
    character split by the end of ``data`` does not count."""
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(data, final=not cut)
    except UnicodeDecodeError as exc:
        return exc.start
    return None


def default_memory(
    home: str | Path,
    file: str = "MEMORY.md",
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_entry_chars: int = DEFAULT_MAX_ENTRY_CHARS,
) -> FileMemory:
    """The default memory source: ``home/<file>`` (``file`` may be absolute)."""
    return FileMemory(Path(home) / file, max_chars=max_chars, max_entry_chars=max_entry_chars)
