"""The service tests' kit: a served runtime, its client, and an SSE reader."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

from actors import Config
from actors.runtime import Runtime
from actors.shells.demo import demo_script
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel
from messages import (
    TurnEnded,
    TurnEvent,
    TurnOutcome,
)

WAIT = 10.0


class Served:
    """A started runtime, its service and an httpx client of it."""

    def __init__(self, rt: Runtime, service: Service, client: httpx.Client) -> None:
        self.rt = rt
        self.service = service
        self.client = client

    def ended(self, session: str) -> threading.Event:
        """Set when ``session``'s next turn ends (subscribed now, before the turn starts)."""
        done = threading.Event()

        def see(event: TurnEvent) -> None:
            if isinstance(event, TurnEnded) and event.session == session:
                done.set()

        self.rt.subscribe(see)
        return done


def outcome(response: httpx.Response) -> TurnOutcome:
    assert response.headers["content-type"] == "application/json"
    decoded: TurnOutcome = msgspec.json.decode(response.content, type=TurnOutcome)
    return decoded


def frames(stream: Iterator[str]) -> Iterator[dict[str, str]]:
    """SSE frames of a line iterator, as ``{"id", "event", "data"}`` dicts (comments skipped)."""
    frame: dict[str, str] = {}
    for line in stream:
        if not line:
            if frame:
                yield frame
            frame = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            frame[key] = value


class Reader:
    """An SSE client on a thread: collects frames until ``until(frame)`` says stop."""

    def __init__(
        self,
        client: httpx.Client,
        until: Callable[[dict[str, str]], bool],
        query: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.frames: list[dict[str, str]] = []
        self.status = 0
        self.connected = threading.Event()
        self.done = threading.Event()
        self._args = (client, until, query, headers or {})
        threading.Thread(target=self._run, daemon=True).start()
        assert self.connected.wait(WAIT)

    def _run(self) -> None:
        client, until, query, headers = self._args
        try:
            with client.stream("GET", f"/v1/events{query}", headers=headers) as response:
                self.status = response.status_code
                self.content_type = response.headers.get("content-type", "")
                self.connected.set()
                for frame in frames(response.iter_lines()):
                    self.frames.append(frame)
                    if until(frame):
                        return
        finally:
            self.connected.set()
            self.done.set()

    def wait(self) -> list[dict[str, str]]:
        assert self.done.wait(WAIT), self.frames
        return self.frames


def ended(session: str) -> Callable[[dict[str, str]], bool]:
    return lambda f: f.get("event") == "TurnEnded" and f'"session":"{session}"' in f["data"]


def serve_fixture(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(script, token=None, tools=None, **settings)``: a runtime on ``script`` (with the
    port ``tools``) served on a free port."""
    homes = itertools.count()
    with contextlib.ExitStack() as stack:

        def start(
            script: Any = demo_script,
            *,
            token: str | None = None,
            tools: Any = None,
            **options: Any,
        ) -> Served:
            config = Config(home=str(tmp_path / f"home{next(homes)}"))
            rt = stack.enter_context(
                Runtime.start(config, model=ScriptedModel(script), tools=tools)
            )
            settings = ServiceSettings("127.0.0.1", 0, token, **options)
            service = stack.enter_context(Service.start(rt, settings))
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            client = stack.enter_context(
                httpx.Client(base_url=service.url, timeout=WAIT, headers=headers)
            )
            return Served(rt, service, client)

        yield start


def wait_for_states(client: httpx.Client, states: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``GET /v1/sessions`` asked again until each session of ``states`` has its state (the
    service learns a turn's end from the events, which may come just after its answer);
    the rows by session."""
    deadline = time.monotonic() + WAIT
    while True:
        listed = client.get("/v1/sessions").json()["sessions"]
        rows = {row["session"]: row for row in listed}
        if all(rows.get(s, {}).get("state") == v for s, v in states.items()):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.02)
