"""Probe: an actor that records what it receives, for message-level tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import pykka

from actors.dispatcher.directory import Directory

__all__ = ["DEFAULT_TIMEOUT", "Probe", "Terminated"]

DEFAULT_TIMEOUT = 5.0
"""Seconds an expectation waits when no timeout is given."""

T = TypeVar("T")


@dataclass(frozen=True)
class Terminated:
    """What a probe receives when an actor it :meth:`~Probe.watch`\\ es has stopped."""

    ref: pykka.ActorRef[Any]


class _ProbeActor(pykka.ThreadingActor):
    # A probe a test forgot to stop must not keep the interpreter alive after the last test.
    use_daemon_thread = True

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self.probe = probe

    def on_receive(self, message: Any) -> None:
        self.probe._record(message)


class Probe:
    """A real actor with an address that records every message it is told.

    Give its :attr:`address` as a ``reply_to``, or subscribe it to events
    (``rt.subscribe(probe.tell)``), then ``expect`` what should arrive::

        probe = Probe.start(rt.directory)
        rt.send_turn("s", "hi", reply_to=probe.address)
        done = probe.expect(TurnCompleted)

    ``expect`` waits for the first not yet expected message that matches, and takes it; a failed
    expectation raises ``AssertionError`` listing everything that did arrive. ``what`` is a type
    (or a tuple of types), a predicate, or an exact message, matched by equality.
    """

    def __init__(self, directory: Directory | None = None, name: str = "probe") -> None:
        self._cond = threading.Condition()
        self._received: list[Any] = []
        self._taken: set[int] = set()
        self._ref: pykka.ActorRef[Any] = _ProbeActor.start(self)
        self._directory = directory
        self._deadline: float | None = None  # the end of the innermost within() block
        self._closed = threading.Event()
        self.address = directory.unique(name) if directory else name
        if directory is not None:
            directory.register(self.address, self)

    @classmethod
    def start(cls, directory: Directory | None = None, name: str = "probe") -> Probe:
        """Start a probe, registered at a fresh address of ``directory`` if one is given."""
        return cls(directory, name)

    @property
    def ref(self) -> pykka.ActorRef[Any]:
        """The probe actor's ref."""
        return self._ref

    @property
    def received(self) -> list[Any]:
        """Every message received so far, in order (expected ones included)."""
        with self._cond:
            return list(self._received)

    def tell(self, message: Any) -> None:
        """Send ``message`` to the probe (what a directory does with its address)."""
        self._ref.tell(message)

    def _record(self, message: Any) -> None:
        with self._cond:
            self._received.append(message)
            self._cond.notify_all()

    @overload
    def expect(self, what: type[T], timeout: float | None = None) -> T: ...
    @overload
    def expect(self, what: Callable[[Any], bool], timeout: float | None = None) -> Any: ...
    @overload
    def expect(self, what: T, timeout: float | None = None) -> T: ...

    def expect(self, what: Any, timeout: float | None = None) -> Any:
        """Wait for a message of type ``what``, one for which ``what(msg)`` is true, or one equal
        to ``what``. Without ``timeout``, wait :data:`DEFAULT_TIMEOUT` seconds, or what is left
        of the enclosing :meth:`within` block."""
        match = _matcher(what)
        deadline = self._timeout(timeout)
        with self._cond:
            found: list[int] = []

            def ready() -> bool:
                for i, message in enumerate(self._received):
                    if i not in self._taken and match(message):
                        found.append(i)
                        return True
                return False

            if not self._cond.wait_for(ready, deadline):
                raise AssertionError(
                    f"expected {_describe(what)} within {deadline} s; received {self._summary()}"
                )
            self._taken.add(found[0])
            return self._received[found[0]]

    def _timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            return timeout
        if self._deadline is not None:
            return max(0.0, self._deadline - time.monotonic())
        return DEFAULT_TIMEOUT

    @contextlib.contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        """A block that must finish within ``seconds``; ``AssertionError`` when it overran.

        Expectations inside it wait at most for what is left of the block::

            with probe.within(2.0):
                rt.send_turn("s", "hi", reply_to=probe.address)
                probe.expect(TurnCompleted)
        """
        start = time.monotonic()
        outer = self._deadline
        end = start + seconds
        self._deadline = end if outer is None else min(end, outer)
        try:
            yield
        finally:
            self._deadline = outer
        took = time.monotonic() - start
        if took > seconds:
            raise AssertionError(f"the block took {took:.3f} s, more than {seconds:g} s")

    def watch(self, ref: pykka.ActorRef[Any]) -> None:
        """Receive :class:`Terminated` (``ref``) once that actor stops; expect it with
        ``probe.expect(Terminated(ref))``."""

        def wait() -> None:
            # pykka sets actor_stopped when the actor's loop ends, however it ended.
            while not ref.actor_stopped.wait(0.05):
                if self._closed.is_set():
                    return
            self._record(Terminated(ref))

        threading.Thread(target=wait, name=f"probe-watch-{ref.actor_urn}", daemon=True).start()

    def next(self, timeout: float | None = None) -> Any:
        """Wait for the next message not yet taken, whatever it is, and take it."""
        return self.expect(_anything, timeout)

    def expect_all(self, what: Any, count: int, timeout: float | None = None) -> list[Any]:
        """Wait for ``count`` matching messages and take them, in arrival order."""
        return [self.expect(what, timeout) for _ in range(count)]

    def expect_none(self, within: float = 0.2, what: Any = None) -> None:
        """Assert that no new message (matching ``what``, if given) arrives ``within`` seconds."""
        match = _matcher(what) if what is not None else (lambda _m: True)
        with self._cond:
            start = len(self._received)

            def arrived() -> bool:
                return any(match(m) for m in self._received[start:])

            if self._cond.wait_for(arrived, within):
                raise AssertionError(
                    f"expected no {_describe(what) if what else 'message'} within {within} s; "
                    f"received {self._received[start:]!r}"
                )

    def _summary(self) -> str:
        if not self._received:
            return "nothing"
        lines = [
            f"\n  {'(taken) ' if i in self._taken else ''}{m!r}"
            for i, m in enumerate(self._received)
        ]
        return f"{len(self._received)} message(s):" + "".join(lines)

    def stop(self) -> None:
        """Stop the probe actor and free its address."""
        self._closed.set()
        if self._directory is not None:
            self._directory.unregister(self.address, self)
        self._ref.stop()


def _anything(message: Any) -> bool:
    return True


def _matcher(what: Any) -> Callable[[Any], bool]:
    if isinstance(what, type):
        return lambda message: isinstance(message, what)
    if isinstance(what, tuple) and all(isinstance(t, type) for t in what):
        return lambda message: isinstance(message, what)
    if callable(what):
        return what  # type: ignore[no-any-return]
    return lambda message: bool(message == what)


def _describe(what: Any) -> str:
    if isinstance(what, type):
        return f"a {what.__name__}"
    if isinstance(what, tuple) and all(isinstance(t, type) for t in what):
        return "one of " + ", ".join(t.__name__ for t in what)
    if not callable(what):
        return f"a message equal to {what!r}"
    return f"a message matching {getattr(what, '__name__', repr(what))}"
