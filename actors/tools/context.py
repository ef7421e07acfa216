"""What a port tool may know about the call it runs (:class:`ToolContext`), and the ticket a
call travels with through the port pool (:class:`Ticket`: its deadline and cancel signal)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Ticket", "ToolContext"]


@dataclass(frozen=True)
class ToolContext:
    """The call a tool runs for. A tool function gets it in a parameter annotated
    ``ToolContext``::

        @port_tool
        def delete_file(path: str, ctx: ToolContext) -> str:
            \"\"\"Delete a file.\"\"\"
            if ctx.untrusted:
                return "Refused: this session has read untrusted data."
            ...

    ``cancelled`` is set when nobody waits for the result any more: the turn was cancelled,
    the call outlived ``port.timeout_s``, or the runtime is stopping. A tool that runs long
    should check it (or ``wait`` on it) and return early; what it returns then is dropped.
    """

    session: str
    """The session whose model made the call."""
    call_id: int
    """The call's id in that session."""
    deadline: float | None = None
    """``time.monotonic()`` by which the call must be done (``port.timeout_s``), or None."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set once the call's result is no longer wanted."""
    untrusted: bool = False
    """The session has read untrusted data: refuse what it should not be trusted with."""

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass
class Ticket:
    """One job on its way through the pool."""

    job: Any
    key: Hashable
    deadline: float | None = None
    """``time.monotonic()`` by which the job should be done, or None."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    """Set when nobody waits for the job's result any more: the job should stop."""
    _answered: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """True for the first caller only: that one answers the job."""
        with self._lock:
            if self._answered:
                return False
            self._answered = True
            return True
