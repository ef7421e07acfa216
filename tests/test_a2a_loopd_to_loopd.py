"""loopd calls loopd over A2A: one real ``loopd serve --listen`` process with
``[a2a] serve = true`` (its model the test kit's ChatServer) is the remote agent ``far`` of a
second runtime started here (``[agents.far] a2a_url``, the service's token in ``headers_env``).

- The parent's ``subagent`` call with ``agent="far"`` is answered with the remote loopd's
  answer, the parent is untrusted after it, and the remote loopd's store holds the turn.
- Cancelling the parent here reaches the remote loopd: its A2A task ends
  ``TASK_STATE_CANCELED``, its model's request is dropped, and the parent's call is answered
  failed.
- A parent whose id is long still gets a remote task: the ``contextId`` the caller sends is a
  session id the remote loopd takes (at most 64 bytes).
- The A2A service loads the CA bundle once (bench/bench_a2a.py found it loaded twice a call).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("a2a.server")

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, TaskState
from serve_process import ServeProcess

from actors import Config, Runtime
from actors.core.config import AgentConfig
from actors.core.remote import remote_context_id
from actors.dispatcher.directory import Directory
from actors.services.a2a import A2aService
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import ChatServer, ScriptedModel, call, reply
from actors.testing.chat_server import Delayed
from messages import (
    FailReason,
    ModelRequest,
    SubagentFinished,
    ToolCallFinished,
    TurnCompleted,
    TurnFailed,
)
from messages.ids import check_top_level_session

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0
TOKEN = "l2l-token-7d2a"
AUTH_ENV = "LOOPD_TEST_L2L_AUTH"


class RemoteLoopd(ServeProcess):
    """``loopd serve --listen 127.0.0.1:0`` with ``[a2a] serve = true`` on ``tmp/far-home``,
    its model at ``model_url``, its token ``TOKEN``."""

    def __init__(self, tmp: Path, model_url: str) -> None:
        config = (
            f'home = "{tmp / "far-home"}"\n[model]\nbase_url = "{model_url}"\n'
            '[serve]\ntoken_env = "LOOPD_FAR_TOKEN"\n'
            '[a2a]\nserve = true\nname = "far"\ndescription = "The far loopd"\n'
        )
        super().__init__(tmp, config, {"LOOPD_FAR_TOKEN": TOKEN}, WAIT, name="far.toml")

    def http(self) -> httpx.Client:
        """A client of the service's ``/v1``, with the token."""
        return httpx.Client(
            base_url=self.url, timeout=WAIT, headers={"Authorization": f"Bearer {TOKEN}"}
        )

    def task_state(self, task_id: str) -> str:
        """The remote task's state as ``GetTask`` (the SDK's client) answers it now."""

        async def read() -> str:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(timeout=WAIT, headers=headers) as http:
                card = await A2ACardResolver(http, f"{self.url}/a2a").get_agent_card()
                config = ClientConfig(streaming=False, httpx_client=http)
                client = ClientFactory(config).create(card)
                try:
                    task = await client.get_task(GetTaskRequest(id=task_id))
                finally:
                    await client.close()
                return str(TaskState.Name(task.status.state))

        return asyncio.run(asyncio.wait_for(read(), WAIT))


@pytest.fixture
def far(tmp_path: Path) -> Iterator[Callable[[str], RemoteLoopd]]:
    """``far(model_url)``: a remote loopd on that model; terminated at the end, whatever
    happened."""
    started: list[RemoteLoopd] = []

    def start(model_url: str) -> RemoteLoopd:
        started.append(RemoteLoopd(tmp_path, model_url))
        return started[-1]

    try:
        yield start
    finally:
        for remote in started:
            remote.stop()


def delegate(task: str) -> Callable[[ModelRequest], Any]:
    """The near parent's model: call ``far`` with ``task`` once, then answer the tool's text."""

    def script(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "user":
            return call("subagent", task=task, agent="far")
        return reply(last.content or "")

    return script


class Near:
    """The calling runtime: profile ``far`` is the remote loopd's A2A endpoint; the events."""

    def __init__(self, home: Path, remote: RemoteLoopd, task: str) -> None:
        far = AgentConfig(
            a2a_url=f"{remote.url}/a2a",
            description="the far loopd",
            headers_env={"Authorization": AUTH_ENV},
        )
        self.config = Config(home=str(home), agents={"far": far})
        self.runtime = Runtime.start(self.config, model=ScriptedModel(delegate(task)))
        self.events: list[Any] = []
        self.lock = threading.Condition()
        self.runtime.subscribe(self._seen)

    def _seen(self, event: Any) -> None:
        with self.lock:
            self.events.append(event)
            self.lock.notify_all()

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def wait_for(self, kind: type) -> Any:
        with self.lock:
            if not self.lock.wait_for(lambda: self.of(kind), WAIT):
                raise AssertionError(f"no {kind.__name__} within {WAIT} s")
            return self.of(kind)[0]

    def remote_task_id(self) -> str:
        """The remote task's id, once the caller has stored it (its row in ``remote_tasks``)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with sqlite3.connect(Path(self.config.home) / DB_NAME) as db:
                rows = db.execute("SELECT task_id FROM remote_tasks").fetchall()
            if rows and rows[0][0]:
                return str(rows[0][0])
            time.sleep(0.02)
        raise AssertionError("the remote task's id was never stored")


@pytest.fixture
def near(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Near]]:
    """``near(remote, task)``: the calling runtime; stopped at the end."""
    monkeypatch.setenv(AUTH_ENV, f"Bearer {TOKEN}")
    made: list[Near] = []

    def start(remote: RemoteLoopd, task: str = "what do the notes say?") -> Near:
        made.append(Near(tmp_path / f"near{len(made)}", remote, task))
        return made[-1]

    try:
        yield start
    finally:
        for n in made:
            n.runtime.stop()


def test_a_loopd_subagent_on_another_loopd_answers_and_taints_the_parent(
    far: Callable[[str], RemoteLoopd], near: Callable[..., Near]
) -> None:
    def far_model(body: dict[str, Any]) -> Any:
        asked = body["messages"][-1]["content"]
        return reply(f"far read: {asked}")

    with ChatServer(far_model) as model:
        remote = far(model.base_url)
        n = near(remote, "what do the notes say?")
        outcome = n.runtime.run_turn("mm", "go", timeout=WAIT)
        assert isinstance(outcome, TurnCompleted), outcome
        assert outcome.content == "sub-mm-1 completed\nfar read: what do the notes say?"
        finished = n.wait_for(SubagentFinished)
        assert (finished.child, finished.completed, finished.detail) == ("sub-mm-1", True, "")
        (result,) = [e for e in n.of(ToolCallFinished) if e.name == "subagent"]
        assert result.untrusted
        # The remote loopd's model got the task alone (no clock line of the caller's turn).
        assert model.requests[-1]["messages"][-1]["content"] == "what do the notes say?"

        with remote.http() as http:
            listed = http.get("/v1/sessions").json()["sessions"]
            (row,) = [r for r in listed if r["session"].startswith("loopd-sub-mm-1-")]
            shown = http.get(f"/v1/sessions/{row['session']}").json()
        assert shown["turns"] == 1 and shown["parent"] is None
        said = [(m["role"], m["content"]) for m in shown["transcript"]]
        assert ("assistant", "far read: what do the notes say?") in said

        n.runtime.stop()
        store = SessionStore(Path(n.config.home) / DB_NAME)
        try:
            assert store.open("mm").untrusted
            child = store.open("sub-mm-1")
            assert child.transcript[-1].content == "far read: what do the notes say?"
        finally:
            store.close()


def test_cancelling_the_parent_cancels_the_remote_loopds_turn(
    far: Callable[[str], RemoteLoopd], near: Callable[..., Near]
) -> None:
    # The far model holds its answer for a minute, unless its client goes away first.
    with ChatServer(lambda body: Delayed(reply("too late"), 60.0)) as model:
        remote = far(model.base_url)
        n = near(remote)
        outcome: list[Any] = []
        done = threading.Event()

        def turn() -> None:
            try:
                outcome.append(n.runtime.run_turn("mm", "go", timeout=WAIT))
            except Exception as exc:  # the test reads it below
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=turn, daemon=True).start()
        model.wait_for_requests(1, timeout=WAIT)  # the far turn runs: its model was asked
        task_id = n.remote_task_id()
        assert remote.task_state(task_id) == "TASK_STATE_WORKING"

        assert n.runtime.cancel("mm") == ("mm", "sub-mm-1")
        assert done.wait(WAIT), "the parent's turn never ended"
        assert isinstance(outcome[0], TurnFailed) and outcome[0].reason is FailReason.CANCELLED
        finished = n.wait_for(SubagentFinished)
        assert finished.child == "sub-mm-1" and not finished.completed

        deadline = time.monotonic() + WAIT
        while (state := remote.task_state(task_id)) != "TASK_STATE_CANCELED":
            assert time.monotonic() < deadline, f"the far task is still {state}"
            time.sleep(0.05)
        model.wait_for_closed(1, timeout=WAIT)  # the far turn dropped its model's request
        with remote.http() as http:
            listed = http.get("/v1/sessions").json()["sessions"]
        (row,) = [r for r in listed if r["session"].startswith("loopd-sub-mm-1-")]
        assert row["state"] != "running", row


def test_a_long_parent_id_still_gives_a_context_the_remote_loopd_takes(
    far: Callable[[str], RemoteLoopd], near: Callable[..., Near]
) -> None:
    parent = "p" * 50  # its child is sub-<50 p>-1: 56 of a session id's 64 bytes
    with ChatServer(lambda body: reply("far answers")) as model:
        remote = far(model.base_url)
        n = near(remote)
        outcome = n.runtime.run_turn(parent, "go", timeout=WAIT)
        assert isinstance(outcome, TurnCompleted), outcome
        assert outcome.content.endswith(" completed\nfar answers"), outcome.content


def test_remote_context_id_is_a_top_level_session_id_of_at_most_64_bytes() -> None:
    assert remote_context_id("sub-mm-1", "0123456789ab") == "loopd-sub-mm-1-0123456789ab"
    for child in ("sub-" + "p" * 58 + "-1", "sub-sub-" + "q" * 40 + "-12-3"):
        context = remote_context_id(child, "0123456789ab")
        assert check_top_level_session(context) == context and len(context) == 64
        assert context.startswith("loopd-sub-") and context.endswith("-0123456789ab")


def test_the_a2a_service_loads_the_ca_bundle_once_for_every_client() -> None:
    # Each transport loading its own (httpx's default) cost some 20 ms of CPU, twice a call.
    service = A2aService({}, Directory(), result_cap=100)

    def context_of(client: httpx.AsyncClient) -> Any:
        return client._transport._inner._pool._ssl_context  # type: ignore[attr-defined]

    first, second = service._http({}, 10), service._http({}, 20)
    assert context_of(first) is context_of(second) is not None
