"""``loopd serve``: the runtime and its scheduler as a long-running process (a daemon).

It runs until SIGTERM, SIGINT or SIGHUP, then stops the runtime cleanly (running turns answered
``CANCELLED``, the store written out) and returns 0. A stop signal repeated while it stops (a
supervisor that sends SIGTERM twice, Ctrl-C pressed again) changes nothing: the stop goes on, and
``loopd serve`` still exits 0. Every turn event is one line on stdout:
the CLI's rendered line, or one JSON object (the event as loopd encodes it) with ``json_lines``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import msgspec

from actors.core.config import Config
from actors.runtime import Runtime
from actors.runtime.collector import tune_collector
from actors.shells.render import EventPrinter, render_event
from actors.shells.served import forget_served, record_served
from actors.shells.service.settings import service_settings
from actors.shells.service.start import start_service
from actors.tools.tool import PortTool
from messages import TurnEvent

__all__ = ["STOP_SIGNALS", "event_line", "serve"]

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
"""The signals that stop ``loopd serve`` cleanly (SIGHUP too: a closed terminal or a supervisor's
hang-up is a stop, not a reload; there is no reload). One the process was started ignoring
(SIGHUP under ``nohup``) stays ignored."""


def event_line(event: TurnEvent, json_lines: bool) -> str:
    """One event as one line: JSON (``{"type": "TurnStarted", ...}``) or the rendered text."""
    if json_lines:
        return msgspec.json.encode(event).decode()
    return render_event(event)


class _LineWriter:
    """Writes lines from the bus thread; a closed or broken stdout only silences it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.broken = False

    def printer(self) -> Callable[[TurnEvent], None]:
        """The CLI's event printer (a streamed answer's pieces on one line) on this stream."""
        printer = EventPrinter(self.stream)

        def show(event: TurnEvent) -> None:
            with self.lock:
                if self.broken:
                    return
                try:
                    printer(event)
                except (BrokenPipeError, ValueError):  # a reader that went away
                    self.broken = True

        return show

    def write(self, line: str) -> None:
        with self.lock:
            if self.broken:
                return
            try:
                print(line, file=self.stream, flush=True)
            except (BrokenPipeError, ValueError):  # a reader that went away, a closed stream
                self.broken = True


def serve(
    config: Config,
    *,
    json_lines: bool = False,
    tools: Iterable[PortTool] = (),
    stop: threading.Event | None = None,
    out: TextIO | None = None,
    restore_signals: bool = True,
    listen: str | None = None,
    tune_gc: bool = False,
) -> int:
    """Run ``config``'s runtime (with its ``[[cron]]`` jobs and ``[heartbeat]``) until ``stop``
    is set, or one of :data:`STOP_SIGNALS` arrives when called on the main thread. Returns 0.

    With ``listen`` (or ``[serve] listen``) it also serves the runtime over HTTP
    (actors.shells.service); a bad address or token setting is refused before anything starts.

    A stop signal while it stops only sets ``stop`` again. At the end the previous handlers are
    put back; with ``restore_signals=False`` (``loopd serve``, whose process ends next) the stop
    signals are ignored instead after a clean stop (a failed start puts them back), so one that
    comes while the process exits cannot kill it with the default action (Python puts the
    default back as it finalises a handler of its own, so keeping ours would not do).

    With ``tune_gc`` (``loopd serve``: the process is loopd's) the garbage collector is set for
    many turns at once (:func:`actors.runtime.collector.tune_collector`) once everything has
    started; an embedder's collector is left as it is.
    """
    settings = service_settings(config, listen)
    service: Any = None
    stopped = False  # a clean stop: only then may the process's last moments ignore signals
    stop = stop or threading.Event()
    writer = _LineWriter(out or sys.stdout)
    previous: dict[signal.Signals, Any] = {}
    wake = _Wake(stop)
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue  # started ignoring it (``nohup``, a background job): it stays ignored
            previous[sig] = signal.signal(sig, wake.on_signal)
    try:
        with Runtime.start(config, tools=tools) as rt:
            if json_lines:
                rt.subscribe(lambda event: writer.write(event_line(event, True)))
            else:
                rt.subscribe(writer.printer())
            if settings is not None:
                service = start_service(rt, settings)
                # The CLI on this home goes through the service (actors.shells.served).
                record_served(config.home_path, service.url, config.serve.token_env)
                print(f"loopd serve: listening on {service.url}", file=sys.stderr, flush=True)
            if tune_gc:
                tune_collector()
            jobs = len(config.cron) + (1 if config.heartbeat else 0)
            print(
                f"loopd serve: running on {config.home} with {jobs} scheduled job(s); "
                "SIGTERM, SIGHUP or Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            )
            wake.wait()
            if service is not None:  # no new requests; the runtime's stop answers the turns
                forget_served(config.home_path)
                service.stop_accepting()
            print("loopd serve: stopping", file=sys.stderr, flush=True)
        if service is not None:  # the runtime has stopped: what is still in flight is answered
            service.close()
        print("loopd serve: stopped", file=sys.stderr, flush=True)
        stopped = True
    finally:
        if service is not None:
            forget_served(config.home_path)
            service.close()
        for sig, handler in previous.items():
            # A start that failed puts the handlers back: an embedder (or a test) that called
            # main() goes on, and an ignored SIGTERM would be inherited by every child process.
            ignore = stopped and not restore_signals
            signal.signal(sig, signal.SIG_IGN if ignore else handler)
        wake.close()  # after the handlers: none of them writes to its pipe any more
    return 0


class _Wake:
    """How the main thread waits for a stop: a read of a pipe that a stop signal's handler, or
    a thread watching ``stop``, writes one byte to.

    A handler that called ``stop.set()`` took the Event's lock; a second signal landing while
    the first handler held it ran a second handler on the same thread, waiting for that lock
    (a storm of SIGTERMs once ended ``loopd serve`` with a traceback from inside the handler).
    A write to a pipe takes no lock, so a storm of signals only fills the pipe."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._closed = False
        self._lock = threading.Lock()  # the watching thread's, never a signal handler's
        threading.Thread(target=self._watch, name="loopd-serve-stop", daemon=True).start()

    def on_signal(self, _signum: int, _frame: object) -> None:
        """A stop signal's handler: wake the main thread; nothing else, no lock. (The pipe is
        closed only once the handlers are put back, so it is open here.)"""
        self._poke()

    def wait(self) -> None:
        """Block until a stop signal or ``stop`` is set; then ``stop`` is set."""
        os.read(self._read, 1)  # a signal's handler runs meanwhile, and the read goes on
        self.stop.set()

    def close(self) -> None:
        """Close the pipe, and let the watching thread end (it writes nothing after this: a
        closed descriptor's number may be another file's by then)."""
        with self._lock:
            self._closed = True
            for fd in (self._read, self._write):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.stop.set()

    def _watch(self) -> None:
        self.stop.wait()
        with self._lock:
            if not self._closed:
                self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending already) or closed
            os.write(self._write, b"\0")
