"""The A2A endpoint of ``loopd serve --listen`` with ``[a2a] serve = true``: the SDK's own
client against a real uvicorn over real actors on the scripted model, for every state and
method (card, SendMessage blocking and streaming, contextId rules, skills, INPUT_REQUIRED and
its follow-up, CancelTask, GetTask after a restart, SubscribeToTask), and the token's gate."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("a2a.server")

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from a2a_kit import (
    WAIT,
    A2aServed,
    collect,
    last_task,
    served,
    settled,
    task_id_of,
    user_message,
)

from actors import port_tool
from actors.core.config import AgentConfig, ConfigError, LoopConfig
from actors.shells.service.a2a.store import CRASHED_TEXT, NOT_WAITING_TEXT
from actors.testing import call, reply
from messages import ModelRequest

pytestmark = pytest.mark.timeout(90)

RELEASE = threading.Event()
"""Set at each test's end: a ``slow`` tool call still running then returns."""


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


@port_tool
def slow(what: str) -> str:
    """Wait until the test lets it go.

    Args:
        what: Anything.
    """
    RELEASE.wait(WAIT)
    return f"slow {what}"


TOOLS = [deploy, slow]


def script(request: ModelRequest) -> Any:
    """By the user's words: ``deploy``, ``family`` (a child), ``loop`` (a tool at every step),
    ``slow``; else an echo. A tool's result is answered ``tool said: <result>``."""
    last = request.messages[-1]
    if last.role != "user":
        return reply(f"tool said: {last.content}")
    text = last.content or ""
    if "deploy" in text:
        return call("deploy", env="prod")
    if "family" in text and not request.session.startswith("sub-"):
        return call("subagent", task="dig")
    if "loop" in text:
        return call("clock")
    if "slow" in text:
        return call("slow", what="thing")
    return reply(f"echo: {text.splitlines()[-1]}")


@pytest.fixture
def a2a(tmp_path: Path) -> Iterator[Any]:
    RELEASE.clear()
    try:
        yield from served(tmp_path)
    finally:
        RELEASE.set()


def state(task: Task) -> str:
    return TaskState.Name(task.status.state)


def status_text(task: Task) -> str:
    return " ".join(p.text for p in task.status.message.parts)


def answer(task: Task) -> str:
    return "".join(p.text for a in task.artifacts for p in a.parts if p.text)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, WAIT * 3))


# --- the card and the gate ---


def test_the_card_names_the_agent_its_skills_and_its_jsonrpc_interface(a2a) -> None:
    s: A2aServed = a2a(
        script,
        agents={"coder": AgentConfig(description="writes code")},
        loop=LoopConfig(system_prompt="You help.\nMore lines."),
    )
    card = httpx.get(f"{s.url}/a2a/.well-known/agent-card.json", timeout=WAIT).json()
    assert card["name"] == "loopd" and card["description"] == "You help."
    assert [(k["id"], k["description"]) for k in card["skills"]] == [
        ("default", "the plain agent"),
        ("coder", "writes code"),
    ]
    assert card["capabilities"]["streaming"] is True
    (interface,) = card["supportedInterfaces"]
    assert interface["url"] == f"{s.url}/a2a/"
    assert (interface["protocolBinding"], interface["protocolVersion"]) == ("JSONRPC", "1.0")


def test_the_token_guards_the_endpoint_but_not_the_card(a2a) -> None:
    s: A2aServed = a2a(script, token="s3cret")
    card = httpx.get(f"{s.url}/a2a/.well-known/agent-card.json", timeout=WAIT)
    assert card.status_code == 200

    async def go() -> None:
        async with s.client() as client:  # with the token: served
            assert answer(await settled(client, user_message("hi"))) == "echo: hi"
        async with httpx.AsyncClient(timeout=WAIT) as http:  # the card, then no token
            with_card = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
            from a2a.client import A2ACardResolver

            resolved = await A2ACardResolver(http, f"{s.url}/a2a").get_agent_card()
            client = with_card.create(resolved)
            with pytest.raises(A2AClientError, match="401"):
                await collect(client, user_message("hi"))

    run(go())


# --- SendMessage: contexts, skills, states ---


def test_a_message_without_context_starts_a2a_n_and_its_context_goes_on(a2a) -> None:
    s: A2aServed = a2a(script)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            first = last_task(await collect(client, user_message("one")))
            assert (state(first), first.context_id, answer(first)) == (
                "TASK_STATE_COMPLETED",
                "a2a-1",
                "echo: one",
            )
            again = last_task(await collect(client, user_message("two", context_id="a2a-1")))
            assert again.context_id == "a2a-1" and again.id != first.id
            other = last_task(await collect(client, user_message("three")))
            assert other.context_id == "a2a-2"
            named = last_task(await collect(client, user_message("four", context_id="mine")))
            assert named.context_id == "mine" and answer(named) == "echo: four"
            listed = await client.list_tasks(ListTasksRequest(context_id="a2a-1"))
            assert sorted(t.id for t in listed.tasks) == sorted([first.id, again.id])

    run(go())
    shown = httpx.get(f"{s.url}/v1/sessions/a2a-1", timeout=WAIT).json()
    assert shown["turns"] == 2  # one session, two turns: one task each


@pytest.mark.parametrize(
    ("context_id", "said"),
    [("sub-boss-1", "children are opened only by their parents"), ("a b", "'a b'")],
)
def test_a_context_that_names_no_top_level_session_is_refused(a2a, context_id, said) -> None:
    s: A2aServed = a2a(script)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            with pytest.raises(InvalidParamsError, match=said) as refused:
                await collect(client, user_message("x", context_id=context_id))
            assert context_id in str(refused.value)

    run(go())


def test_the_skill_picks_the_agent_profile_and_an_unknown_one_is_refused(a2a) -> None:
    s: A2aServed = a2a(script, agents={"coder": AgentConfig(description="writes code")})

    async def go() -> None:
        async with s.client(streaming=False) as client:
            done = last_task(await collect(client, user_message("hi", skill="coder")))
            assert state(done) == "TASK_STATE_COMPLETED"
            with pytest.raises(InvalidParamsError, match="'nobody' is not a skill"):
                await collect(client, user_message("hi", skill="nobody"))
            return done.context_id

    context = run(go())
    assert httpx.get(f"{s.url}/v1/sessions/{context}", timeout=WAIT).json()["agent"] == "coder"


def test_a_failed_turn_fails_its_task_with_the_reason(a2a) -> None:
    s: A2aServed = a2a(script, loop=LoopConfig(max_steps=1))

    async def go() -> None:
        async with s.client(streaming=False) as client:
            failed = last_task(await collect(client, user_message("loop")))
            assert state(failed) == "TASK_STATE_FAILED"
            assert status_text(failed).startswith("turn_limit: ")

    run(go())


def test_streaming_tells_the_start_each_child_and_the_end(a2a) -> None:
    s: A2aServed = a2a(script)

    async def go() -> None:
        async with s.client() as client:
            items = await collect(client, user_message("family", context_id="boss"))
        texts = [
            " ".join(p.text for p in i.status_update.status.message.parts)
            for i in items
            if i.HasField("status_update")
        ]
        assert "turn of boss started (agent default)" in texts
        assert "subagent sub-boss-1 started (agent default)" in texts
        assert "subagent sub-boss-1 completed" in texts
        final = items[-1].status_update.status
        assert TaskState.Name(final.state) == "TASK_STATE_COMPLETED"
        artifacts = [i.artifact_update.artifact for i in items if i.HasField("artifact_update")]
        assert artifacts[-1].parts[0].text.startswith("tool said: sub-boss-1 completed")

    run(go())


# --- INPUT_REQUIRED ---


def test_a_waiting_call_is_input_required_and_a_data_part_approves_it(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            waiting = last_task(await collect(client, user_message("deploy", context_id="ops")))
            assert state(waiting) == "TASK_STATE_INPUT_REQUIRED"
            said = status_text(waiting)
            assert "session ops" in said and "call_id 1" in said and "tool deploy" in said
            assert '{"env": "prod"}' in said or '{"env":"prod"}' in said

            for bad, why in [
                ({"call_id": 7, "approve": True}, "call_id 7 does not wait"),
                ({"call_id": 1}, '"approve" must be true or false'),
                ({"call_id": 1, "approve": False}, 'a decline needs a "reason"'),
                ({"call_id": 1.5, "approve": True}, "call_id"),
                ({"call_id": 1, "approve": True, "why": 1}, "unknown field 'why'"),
                (None, "must be a data part object"),
            ]:
                request = user_message(
                    None if bad is not None else "yes", task_id=waiting.id, data=bad
                )
                with pytest.raises(InvalidParamsError, match=why) as refused:
                    await collect(client, request)
                assert "call_id 1 (tool deploy of ops)" in str(refused.value)
            still = await client.get_task(GetTaskRequest(id=waiting.id))
            assert state(still) == "TASK_STATE_INPUT_REQUIRED"

            busy = user_message("again", context_id="ops")
            with pytest.raises(InvalidParamsError, match=f"task {waiting.id} is running"):
                await collect(client, busy)

            decision = user_message(task_id=waiting.id, data={"call_id": 1.0, "approve": True})
            done = last_task(await collect(client, decision))
            assert state(done) == "TASK_STATE_COMPLETED"
            assert answer(done) == "tool said: deployed to prod"

    run(go())


def test_a_declined_call_answers_the_model_with_the_reason(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)

    async def go() -> None:
        async with s.client() as client:
            items = await collect(client, user_message("deploy", context_id="ops"))
            task_id = task_id_of(items)
            assert TaskState.Name(items[-1].status_update.status.state) == (
                "TASK_STATE_INPUT_REQUIRED"
            )
            no = user_message(
                task_id=task_id, data={"call_id": 1, "approve": False, "reason": "not today"}
            )
            rest = await collect(client, no)
            final = rest[-1].status_update.status
            assert TaskState.Name(final.state) == "TASK_STATE_COMPLETED"
            done = await client.get_task(GetTaskRequest(id=task_id))
            assert answer(done) == "tool said: Denied: a person declined this call: not today."

    run(go())


# --- CancelTask, SubscribeToTask ---


def test_cancel_task_cancels_a_running_turn_and_its_family(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            request = user_message("slow", context_id="busy")
            request.configuration.return_immediately = True
            started = last_task(await collect(client, request))
            cancelled = await client.cancel_task(CancelTaskRequest(id=started.id))
            assert state(cancelled) == "TASK_STATE_CANCELED"
            again = await client.get_task(GetTaskRequest(id=started.id))
            assert state(again) == "TASK_STATE_CANCELED"
            # the session is free again: a new message runs a new turn
            RELEASE.set()
            after = last_task(await collect(client, user_message("hi", context_id="busy")))
            assert answer(after) == "echo: hi"

    run(go())


def test_cancel_task_of_a_waiting_task_drops_its_call(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            waiting = last_task(await collect(client, user_message("deploy", context_id="ops")))
            cancelled = await client.cancel_task(CancelTaskRequest(id=waiting.id))
            assert state(cancelled) == "TASK_STATE_CANCELED"

    run(go())
    assert s.rt.pending_approvals() == ()


def test_subscribe_to_task_reattaches_to_a_running_one(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)

    async def go() -> None:
        async with s.client() as client:
            request = user_message("slow", context_id="later")
            request.configuration.return_immediately = True
            async with s.client(streaming=False) as blocking:
                started = last_task(await collect(blocking, request))
            stream = client.subscribe(SubscribeToTaskRequest(id=started.id))
            first = await anext(stream)
            assert first.HasField("task") and first.task.id == started.id
            RELEASE.set()
            rest = [item async for item in stream]
            final = rest[-1].status_update.status
            assert TaskState.Name(final.state) == "TASK_STATE_COMPLETED"

    run(go())


# --- after a restart ---


def test_get_task_answers_from_the_store_after_a_restart(tmp_path: Path) -> None:
    RELEASE.clear()
    first = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def before() -> tuple[str, str]:
            async with first.client(streaming=False) as client:
                done = last_task(await collect(client, user_message("one")))
                waiting = last_task(await collect(client, user_message("deploy")))
                assert state(waiting) == "TASK_STATE_INPUT_REQUIRED"
                return done.id, waiting.id

        done_id, waiting_id = run(before())
    finally:
        first.stop()
    second = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def after() -> None:
            async with second.client(streaming=False) as client:
                done = await client.get_task(GetTaskRequest(id=done_id))
                assert (state(done), answer(done), done.context_id) == (
                    "TASK_STATE_COMPLETED",
                    "echo: one",
                    "a2a-1",
                )
                waiting = await client.get_task(GetTaskRequest(id=waiting_id))
                assert state(waiting) == "TASK_STATE_INPUT_REQUIRED"
                fresh = last_task(await collect(client, user_message("three")))
                assert fresh.context_id == "a2a-3"  # counts on from the stored contexts
                yes = user_message(task_id=waiting_id, data={"call_id": 1, "approve": True})
                resumed = last_task(await collect(client, yes))
                assert state(resumed) == "TASK_STATE_COMPLETED"
                assert answer(resumed) == "tool said: deployed to prod"

        run(after())
    finally:
        second.stop()


def test_a_task_cut_off_by_a_stop_is_failed_at_the_next_start(tmp_path: Path) -> None:
    RELEASE.clear()
    first = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def before() -> str:
            async with first.client(streaming=False) as client:
                request = user_message("slow")
                request.configuration.return_immediately = True
                return str(last_task(await collect(client, request)).id)

        task_id = run(before())
    finally:
        first.stop()  # the turn is still running: the stop cuts it off
        RELEASE.set()
    second = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def after() -> None:
            async with second.client(streaming=False) as client:
                task = await client.get_task(GetTaskRequest(id=task_id))
                # the stop answered the turn cancelled; if the service had stopped before
                # that reached the task, the next start found it working: failed, crashed
                assert state(task) in ("TASK_STATE_FAILED", "TASK_STATE_CANCELED"), task
                if state(task) == "TASK_STATE_FAILED":
                    assert status_text(task) == CRASHED_TEXT

        run(after())
    finally:
        second.stop()


# --- configuration ---


def test_a2a_serve_without_an_address_or_without_the_sdk_is_refused(monkeypatch) -> None:
    from actors import Config
    from actors.core.config import A2aConfig
    from actors.shells.service import settings

    config = Config(home="/nonexistent", a2a=A2aConfig(serve=True))
    with pytest.raises(ConfigError, match="give --listen"):
        settings.service_settings(config)
    # The SDK looked for and not found (as on an install without the a2a extra):
    real = settings.importlib.util.find_spec
    monkeypatch.setattr(
        settings.importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("a2a") else real(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install '\.\[a2a\]'"):
        settings.service_settings(config, "127.0.0.1:0")


# --- a typed profile, and a turn started elsewhere ---

SCHEMA = {
    "type": "object",
    "properties": {"status": {"type": "string"}, "hosts": {"type": "integer"}},
    "required": ["status", "hosts"],
    "additionalProperties": False,
}


def test_a_typed_profile_answers_its_output_as_a_data_part(a2a) -> None:
    def typed(request: ModelRequest) -> Any:
        return call("final_answer", status="green", hosts=3)

    s: A2aServed = a2a(typed, agents={"checker": AgentConfig(output_schema=SCHEMA)})

    async def go() -> None:
        async with s.client(streaming=False) as client:
            done = last_task(await collect(client, user_message("status?", skill="checker")))
            assert state(done) == "TASK_STATE_COMPLETED"
            text, data = done.artifacts[-1].parts
            assert text.text == '{"status":"green","hosts":3}'
            from google.protobuf import json_format

            assert json_format.MessageToDict(data.data) == {"status": "green", "hosts": 3.0}

    run(go())


def test_a_session_busy_with_a_turn_started_elsewhere_refuses_a_message(a2a) -> None:
    s: A2aServed = a2a(script, tools=TOOLS)
    seen = threading.Event()
    s.rt.subscribe(lambda e: seen.set() if type(e).__name__ == "ToolCallStarted" else None)
    s.rt.send_turn("shared", "slow")  # the Python API's turn, not an A2A task
    assert seen.wait(WAIT)

    async def go() -> None:
        async with s.client(streaming=False) as client:
            with pytest.raises(InvalidParamsError, match="a turn not started over A2A"):
                await collect(client, user_message("hi", context_id="shared"))

    run(go())


def test_a_waiting_task_whose_call_was_dropped_elsewhere_is_failed_at_the_next_start(
    tmp_path: Path,
) -> None:
    first = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def before() -> str:
            async with first.client(streaming=False) as client:
                waiting = last_task(await collect(client, user_message("deploy", context_id="o")))
                assert state(waiting) == "TASK_STATE_INPUT_REQUIRED"
                return str(waiting.id)

        task_id = run(before())
        assert first.rt.cancel("o") == ("o",)  # the Python API's cancel: the call is dropped
        assert first.rt.pending_approvals() == ()
    finally:
        first.stop()
    second = A2aServed(tmp_path / "home", script, tools=TOOLS)
    try:

        async def after() -> None:
            async with second.client(streaming=False) as client:
                task = await client.get_task(GetTaskRequest(id=task_id))
                assert state(task) == "TASK_STATE_FAILED"
                assert status_text(task) == NOT_WAITING_TEXT

        run(after())
    finally:
        second.stop()
