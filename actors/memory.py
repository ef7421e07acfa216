"""Memory: the text every new baseline carries, and the hook told when a session has run."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["FileMemory", "MemoryFailure", "MemorySource", "default_memory"]


class MemoryFailure(Exception):
    """The memory source could not produce its block; the message names what failed."""


@runtime_checkable
class MemorySource(Protocol):
    """Where the memory block of new baselines comes from, and who hears about finished turns."""

    def block(self) -> str:
        """The text that goes into every new baseline. May raise (the spawn then fails)."""
        ...

    def updated(self, session: str, turns: int) -> None:
        """``session`` finished a turn and now has ``turns`` turns. Errors are ignored."""
        ...


UPDATES_KEPT = 1000
"""How many ``updated`` calls a FileMemory keeps (the newest), so a long run stays bounded."""


class FileMemory:
    """A :class:`MemorySource` reading one UTF-8 text file, afresh on every :meth:`block`."""

    def __init__(self, path: str | Path) -> None:
        """Read from ``path``; it need not exist (yet)."""
        self.path = Path(path)
        self._lock = threading.Lock()
        self._updates: deque[tuple[str, int]] = deque(maxlen=UPDATES_KEPT)

    def block(self) -> str:
        """The file's text; ``""`` when there is no file.

        A leading BOM is dropped. A directory, an unreadable file or one that is not valid
        UTF-8 raises :class:`MemoryFailure` naming the path.
        """
        try:
            return self.path.read_text(encoding="utf-8-sig")
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            raise MemoryFailure(f"cannot read memory file {self.path}: {exc}") from exc

    def remember(self, line: str) -> None:
        """Append ``line`` (one line: newlines become spaces) to the memory file.

        New baselines see it from then on; the baseline of a running session never changes.
        """
        text = " ".join(line.split())
        if not text:
            raise MemoryFailure("there is nothing to remember: the text is empty")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock, self.path.open("ab+") as out:
                # Only the last byte matters: does the file end its last line?
                end = out.seek(0, 2)
                if end and (out.seek(end - 1), out.read(1))[1] != b"\n":
                    out.write(b"\n")
                out.write(f"- {text}\n".encode())
        except OSError as exc:
            raise MemoryFailure(f"cannot write memory file {self.path}: {exc}") from exc

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


def default_memory(home: str | Path, file: str = "MEMORY.md") -> FileMemory:
    """The default memory source: ``home/<file>`` (``file`` may be absolute)."""
    return FileMemory(Path(home) / file)
