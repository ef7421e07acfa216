"""Lending a caller's own thread to the dispatcher, with Ctrl-C held while handlers run on it.

A caller that tells an actor and then waits (``Runtime.run_turn``) can run that actor's handler
itself instead of waking a dispatcher thread for it: :meth:`Dispatcher.lend` does that. On a
small VM a thread woken on another CPU costs about as much as the handler, so this is one
hand-off fewer per turn.

A handler lent the main thread could be cut in half by ``KeyboardInterrupt``: Python runs
signal handlers on the main thread only, between two bytecodes, and an exception out of an
actor's handler stops every actor (pykka's rule). So on the main thread a SIGINT that arrives
while the handlers run is held and given to the application's own SIGINT handler at once after
them, before the caller goes on: a Ctrl-C still interrupts the caller, never an actor. Other
threads never run signal handlers and are lent as they are.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, cast

from actors.dispatcher._pool import Dispatcher

try:
    # The C module under ``signal``: its functions take and give plain handlers, where
    # ``signal``'s wrappers try each handler as an enum member and raise and catch a ValueError
    # for every function, three a turn (12.3 µs a swap of the handler, against 0.6 µs here).
    import _signal  # type: ignore[import-not-found]

    _getsignal = cast(Callable[[int], Any], _signal.getsignal)
    _setsignal = cast(Callable[[int, Any], Any], _signal.signal)
except ImportError:  # not CPython
    _getsignal, _setsignal = signal.getsignal, signal.signal

__all__ = ["lend_caller"]


@contextlib.contextmanager
def lend_caller(dispatcher: Dispatcher) -> Iterator[None]:
    """Lend the calling thread to ``dispatcher`` for the messages told inside the block (see
    :meth:`Dispatcher.lend`); on the main thread, with SIGINT held until the block's handlers
    are done and then handed to the SIGINT handler that was in place."""
    if threading.current_thread() is not threading.main_thread():
        with dispatcher.lend():
            yield
        return
    handler = _getsignal(signal.SIGINT)
    if not callable(handler):  # SIG_IGN, SIG_DFL, or not set from Python: nothing raises
        with dispatcher.lend():
            yield
        return
    held: list[FrameType | None] = []

    def hold(_signum: int, frame: FrameType | None) -> None:
        held.append(frame)

    try:
        _setsignal(signal.SIGINT, hold)
    except ValueError:  # not the main interpreter's main thread after all: do not lend
        yield
        return
    try:
        with dispatcher.lend():
            yield
    finally:
        _setsignal(signal.SIGINT, handler)
        if held:  # the Ctrl-C, now that no handler of an actor is running here
            handler(signal.SIGINT, held[0])
