"""The A2A endpoint of a real ``loopd serve --listen`` process, its model the test kit's
scripted model server (ChatServer) streaming its answers: the SDK's streaming client gets the
answer's text as artifact updates, then the final one; the token guards the endpoint; after
SIGTERM and a new ``loopd serve`` on the same home, ``GetTask`` answers from the store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("a2a.server")

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, TaskState
from a2a_kit import collect, task_id_of, user_message
from serve_process import ServeProcess

from actors.testing import ChatServer, reply

TIMEOUT_S = 30.0
TOKEN = "a2a-daemon-token-5c1e"

pytestmark = pytest.mark.timeout(120)


class Daemon(ServeProcess):
    """``loopd serve --listen 127.0.0.1:0`` with ``[a2a] serve = true`` on ``home``."""

    def __init__(self, tmp: Path, base_url: str) -> None:
        config = (
            f'home = "{tmp / "home"}"\n[model]\nbase_url = "{base_url}"\nstream = true\n'
            '[serve]\ntoken_env = "LOOPD_A2A_TOKEN"\n'
            '[a2a]\nserve = true\nname = "notes"\ndescription = "Keeps notes"\n'
        )
        super().__init__(tmp, config, {"LOOPD_A2A_TOKEN": TOKEN}, TIMEOUT_S)


async def client_of(url: str, http: httpx.AsyncClient, streaming: bool = True):  # type: ignore[no-untyped-def]
    card = await A2ACardResolver(http, f"{url}/a2a").get_agent_card()
    return card, ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)


def test_a_served_home_streams_a_task_and_answers_it_after_a_restart(tmp_path: Path) -> None:
    def answer(body: dict) -> object:
        return reply("The notes say: ship on Friday.")

    with ChatServer(answer) as server:
        first = Daemon(tmp_path, server.base_url)
        try:

            async def before() -> str:
                async with httpx.AsyncClient(timeout=TIMEOUT_S) as anonymous:
                    card = await anonymous.get(f"{first.url}/a2a/.well-known/agent-card.json")
                    assert card.status_code == 200 and card.json()["name"] == "notes"
                    denied = await anonymous.post(f"{first.url}/a2a/", json={})
                    assert denied.status_code == 401
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with httpx.AsyncClient(timeout=TIMEOUT_S, headers=headers) as http:
                    card, client = await client_of(first.url, http)
                    assert card.description == "Keeps notes"
                    items = await collect(client, user_message("what is on?", context_id="notes"))
                    pieces = [i.artifact_update for i in items if i.HasField("artifact_update")]
                    streamed = [p.artifact.parts[0].text for p in pieces[:-1]]
                    assert len(streamed) > 1  # the model's stream, piece by piece
                    assert not pieces[0].append and all(p.append for p in pieces[1:-1])
                    assert "".join(streamed) == "The notes say: ship on Friday."
                    final = pieces[-1]
                    assert not final.append and final.last_chunk
                    assert final.artifact.parts[0].text == "The notes say: ship on Friday."
                    last = items[-1].status_update.status
                    assert TaskState.Name(last.state) == "TASK_STATE_COMPLETED"
                    return task_id_of(items)

            task_id = asyncio.run(before())
            assert first.stop() == 0
        finally:
            first.kill()
        second = Daemon(tmp_path, server.base_url)
        try:

            async def after() -> None:
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with httpx.AsyncClient(timeout=TIMEOUT_S, headers=headers) as http:
                    _, client = await client_of(second.url, http, streaming=False)
                    task = await client.get_task(GetTaskRequest(id=task_id))
                    assert TaskState.Name(task.status.state) == "TASK_STATE_COMPLETED"
                    assert task.context_id == "notes"
                    assert task.artifacts[-1].parts[0].text == "The notes say: ship on Friday."

            asyncio.run(after())
            assert second.stop() == 0
        finally:
            second.kill()
