"""The port's event loop: ``async def`` tools run here, as tasks, never on a worker thread.

One loop on one daemon thread per runtime, started with the port and stopped with it. A tool
coroutine that awaits I/O holds no thread while it waits, so a thousand slow async tools cost
a thousand tasks, not a thousand threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ToolLoop"]

T = TypeVar("T")


class ToolLoop:
    """An asyncio loop on its own thread; :meth:`submit` runs a coroutine there."""

    def __init__(self, name: str = "loopd-tools") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop; its future is done when the coroutine is."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs and end the loop's thread."""
        if self._loop.is_closed():
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.call_soon(self._loop.stop)

        self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
