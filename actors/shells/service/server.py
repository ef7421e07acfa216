"""The service on uvicorn, on a thread of its own with its own event loop (uvloop's, and
httptools' parser, where the ``serve`` extra installed them).

:meth:`Service.start` binds the address first (so a taken port fails at once, naming it), then
runs uvicorn on that socket. Stopping is two steps, so that every request in flight gets an
answer: :meth:`Service.stop_accepting` closes the listener and refuses new turns; the caller
then stops the runtime, which answers every running turn (``TurnFailed``); :meth:`Service.close`
ends the event streams, answers any turn still waited on, and waits for uvicorn to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

import uvicorn

from actors.aio import AsyncRuntime
from actors.core.config import ConfigError
from actors.core.listen import format_listen
from actors.runtime import Runtime
from actors.shells.service.app import ServiceState, create_app
from actors.shells.service.settings import ServiceSettings

__all__ = ["GRACE_S", "RUNBOOK_LISTEN", "Service", "http_parser", "loop_factory"]

RUNBOOK_LISTEN = "see docs/runbook.md#serve-cannot-listen"

GRACE_S = 30.0
"""Seconds uvicorn waits for the requests in flight when the service stops; the runtime's stop
(10 s at most) answers every turn well within it."""


def http_parser() -> str:
    """uvicorn's HTTP parser: ``httptools`` (llhttp, in C) where it is installed, as the
    ``serve`` extra installs it; else ``h11`` (pure Python, about a third of the service's CPU
    per request)."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The service loop's maker: uvloop's where it is installed (the ``serve`` extra installs
    it where it has wheels), its sockets and callbacks in C; else None, asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ``OSError`` naming the address if it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(
            f"cannot listen on {format_listen(host, port)}: {exc.strerror}; {RUNBOOK_LISTEN}"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # as uvicorn: a burst of connects must not be dropped
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {format_listen(host, port)}: {exc.strerror}; {RUNBOOK_LISTEN}"
        ) from None
    sock.setblocking(False)
    return sock


class Service:
    """A running HTTP service over a started :class:`~actors.runtime.Runtime`."""

    def __init__(self, runtime: Runtime, settings: ServiceSettings) -> None:
        self.settings = settings
        self._socket = _bind(settings.host, settings.port)
        self.app = create_app(AsyncRuntime(runtime), settings)
        self.state: ServiceState = self.app.state.service
        if runtime.config.a2a.serve:
            self._mount_a2a()
        config = uvicorn.Config(
            self.app,
            http=http_parser(),
            ws="none",
            lifespan="on",
            log_config=None,
            log_level="warning",
            access_log=False,  # request lines are not events; and never a header
            proxy_headers=False,  # no client address is used: no X-Forwarded-For to trust
            server_header=False,
            timeout_graceful_shutdown=int(GRACE_S),
            # Longer than uvicorn's 5 s: a client reusing an idle connection then races its
            # close less often (a lost race fails a POST, which a client does not resend).
            timeout_keep_alive=30,
        )
        self._server = uvicorn.Server(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="loopd-service", daemon=True)

    def _mount_a2a(self) -> None:
        """Mount the A2A endpoint (``[a2a] serve``); ``ConfigError`` without its extra."""
        try:
            from actors.shells.service.a2a.endpoint import mount_a2a
        except ImportError as exc:
            self._socket.close()
            raise ConfigError(
                f"a2a.serve is true but the A2A SDK is not installed ({exc.name} is missing): "
                "install loopd with its a2a extra, pip install '.[a2a]'"
            ) from None
        self.state.closers.append(mount_a2a(self.app, self.state))

    @classmethod
    def start(cls, runtime: Runtime, settings: ServiceSettings, timeout: float = 10.0) -> Service:
        """Bind ``settings``' address and serve ``runtime`` on it; returns once it answers.

        Raises ``OSError`` naming the address if it cannot be bound, ``RuntimeError`` if uvicorn
        does not start within ``timeout`` seconds.
        """
        service = cls(runtime, settings)
        service._thread.start()
        deadline = time.monotonic() + timeout
        # uvicorn says it has started only by a flag; the socket already listens meanwhile.
        while not service._server.started:
            if not service._thread.is_alive() or time.monotonic() > deadline:
                service._socket.close()
                raise RuntimeError(
                    f"the service on {settings.address} did not start: {service._failure!r}"
                )
            time.sleep(0.005)
        return service

    @property
    def port(self) -> int:
        """The port listened on (the one the system picked, for port 0)."""
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{format_listen(self.settings.host, self.port)}"

    def _run(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await self._server.serve(sockets=[self._socket])

        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                runner.run(serve())
        except BaseException as exc:  # SystemExit from a failed startup included
            self._failure = exc

    def stop_accepting(self) -> None:
        """Close the listener and refuse new turns (503); requests in flight go on."""
        self.state.stopping = True
        self._server.should_exit = True

    def close(self, timeout: float = GRACE_S + 5) -> None:
        """End every event stream, answer every turn still waited on, and wait for uvicorn to
        answer what is in flight and stop. Call after the runtime has stopped."""
        self.stop_accepting()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(self.state.finish)
        self._thread.join(timeout)
        with contextlib.suppress(OSError):
            self._socket.close()

    def __enter__(self) -> Service:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Service({self.url!r})"
