"""The A2A tests' kit: a runtime on a scripted model, served with ``[a2a] serve = true`` on a
free port of 127.0.0.1 by a real uvicorn, and the SDK's own client of it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest, StreamResponse, Task
from google.protobuf import json_format, struct_pb2

from actors import Config
from actors.core.config import A2aConfig
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel

WAIT = 15.0


class A2aServed:
    """A started runtime and its service with the A2A endpoint; ``stop()`` stops both (as a
    restart does: the home is then free for another ``start``)."""

    def __init__(
        self,
        home: Path,
        script: Any,
        *,
        token: str | None = None,
        tools: Any = None,
        **config: Any,
    ) -> None:
        options = {"a2a": A2aConfig(serve=True), **config}
        self.config = Config(home=str(home), **options)
        self.token = token
        self._stack = contextlib.ExitStack()
        self.rt = self._stack.enter_context(
            Runtime.start(self.config, model=ScriptedModel(script), tools=tools)
        )
        settings = ServiceSettings("127.0.0.1", 0, token)
        self.service = self._stack.enter_context(Service.start(self.rt, settings))
        self.url = self.service.url

    def headers(self) -> dict[str, str]:
        """The token's header, if the service has one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @contextlib.asynccontextmanager
    async def client(self, *, streaming: bool = True) -> AsyncIterator[Client]:
        """The SDK's client of this endpoint (the card read as any client reads it)."""
        async with httpx.AsyncClient(timeout=WAIT, headers=self.headers()) as http:
            card = await A2ACardResolver(http, f"{self.url}/a2a").get_agent_card()
            client = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(
                card
            )
            try:
                yield client
            finally:
                await client.close()

    def stop(self) -> None:
        """Stop the service and the runtime."""
        self._stack.close()


def user_message(
    text: str | None = None,
    *,
    context_id: str | None = None,
    task_id: str | None = None,
    skill: str | None = None,
    data: Any = None,
    n: list[int] = [0],  # noqa: B006 - a counter shared by every call, on purpose
) -> SendMessageRequest:
    """A ``SendMessageRequest`` of one user message: a text part and/or a data part."""
    n[0] += 1
    parts = []
    if text is not None:
        parts.append(Part(text=text))
    if data is not None:
        value = struct_pb2.Value()
        json_format.ParseDict(data, value)
        parts.append(Part(data=value))
    message = Message(message_id=f"m{n[0]}", role=Role.ROLE_USER, parts=parts)
    if context_id:
        message.context_id = context_id
    if task_id:
        message.task_id = task_id
    if skill is not None:
        message.metadata.update({"skill": skill})
    return SendMessageRequest(message=message)


async def collect(client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    """Every item the client yields for ``request``."""
    return [item async for item in client.send_message(request)]


def last_task(items: list[StreamResponse]) -> Task:
    """The task as the last item that carries one (a task, or a status update's state)."""
    for item in reversed(items):
        if item.HasField("task"):
            return item.task
    raise AssertionError(f"no task among {items}")


def served(tmp_path: Path) -> Iterator[Any]:
    """``start(script, **config)``: an :class:`A2aServed` on ``tmp_path/home``; all stopped at
    the end."""
    started: list[A2aServed] = []

    def start(script: Any, **options: Any) -> A2aServed:
        s = A2aServed(tmp_path / "home", script, **options)
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.stop()


def task_id_of(items: list[StreamResponse]) -> str:
    """The task id the items are about."""
    for item in items:
        for field in ("task", "status_update", "artifact_update"):
            if item.HasField(field):
                got = getattr(item, field)
                return str(got.id if field == "task" else got.task_id)
    raise AssertionError(f"no task among {items}")


async def settled(client: Client, request: SendMessageRequest) -> Task:
    """Send ``request`` (streaming or not), then read its task back with ``GetTask``."""
    from a2a.types import GetTaskRequest

    items = await collect(client, request)
    return await client.get_task(GetTaskRequest(id=task_id_of(items)))
