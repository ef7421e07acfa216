"""A2A calling out: a profile with ``a2a_url`` runs its children as proxies of remote tasks.

Real parts only: real A2A agents built with the SDK (tests/a2a_agents.py) served by a real
uvicorn on 127.0.0.1, a real runtime on a real SQLite store, a scripted model whose parent
calls ``subagent`` with the remote profile. Plus the pure decisions of ``actors.core.remote``.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from a2a_agents import A2aAgents

from actors import Config, Runtime
from actors.core.config import AgentConfig, ConfigError, LoopConfig
from actors.core.remote import (
    card_interfaces,
    on_origin,
    parts_text,
    remote_task_text,
    task_step,
)
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import ScriptedModel, call, reply
from messages import (
    FailReason,
    ModelRequest,
    SubagentFinished,
    ToolCallFinished,
    TurnCompleted,
    TurnEnded,
)
from messages.remote import RemoteTaskRow

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0


@pytest.fixture(scope="module")
def agents() -> Iterator[A2aAgents]:
    server = A2aAgents()
    yield server
    server.stop()


def delegate(task: str = "hello there", agent: str = "far") -> Callable[[ModelRequest], Any]:
    """A parent model: call ``agent`` with ``task`` once, then answer the tool's text."""

    def script(request: ModelRequest) -> Any:
        last = request.messages[-1]
        if last.role == "user":
            return call("subagent", task=task, agent=agent)
        return reply(last.content or "")

    return script


class Run:
    """A runtime whose profile ``far`` is a remote agent, and the events it told."""

    def __init__(self, home: Path, url: str, **profile: Any) -> None:
        loop = profile.pop("loop", {})
        self.config = Config(
            home=str(home),
            agents={"far": AgentConfig(a2a_url=url, description="remote", **profile)},
            **({"loop": LoopConfig(**loop)} if loop else {}),
        )
        self.events: list[Any] = []
        self.lock = threading.Condition()
        self.runtime = Runtime.start(self.config, model=ScriptedModel(delegate()))
        self.runtime.subscribe(self._seen)

    def _seen(self, event: Any) -> None:
        with self.lock:
            self.events.append(event)
            self.lock.notify_all()

    def finished(self) -> SubagentFinished:
        """The parent's SubagentFinished (told once its result is stored)."""
        with self.lock:
            found: list[SubagentFinished] = []

            def seen() -> bool:
                found[:] = [e for e in self.events if isinstance(e, SubagentFinished)]
                return bool(found)

            if not self.lock.wait_for(seen, WAIT):
                raise AssertionError("no SubagentFinished")
            return found[0]

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def stop(self) -> None:
        self.runtime.stop()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def start(url: str, **profile: Any) -> Run:
        made.append(Run(tmp_path / f"home{len(made)}", url, **profile))
        return made[-1]

    yield start
    for r in made:
        r.stop()


def remote_rows(home: str) -> list[Any]:
    with sqlite3.connect(Path(home) / DB_NAME) as db:
        return db.execute("SELECT * FROM remote_tasks").fetchall()


# --- whole turns against real remote agents ---------------------------------------------------


def test_a_remote_child_answers_like_a_local_one_and_its_result_is_untrusted(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("echo"))
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.content == "sub-mm-1 completed\necho: hello there"
    assert "hello there" in agents.recorder.texts  # the task alone, no clock line
    finished = r.finished()
    assert (finished.child, finished.completed, finished.detail) == ("sub-mm-1", True, "")
    (result,) = [e for e in r.of(ToolCallFinished) if e.name == "subagent"]
    assert result.untrusted  # a remote result taints the parent
    child = [e for e in r.of(TurnEnded) if e.session == "sub-mm-1"]
    assert child and child[0].completed
    r.stop()
    store = SessionStore(Path(r.config.home) / DB_NAME)
    try:
        record = store.open("sub-mm-1")
        assert record.parent == "mm" and record.agent == "far" and record.untrusted
        assert [m.role for m in record.transcript] == ["user", "assistant"]
        assert record.transcript[-1].content == "echo: hello there"
        assert store.open("mm").untrusted
    finally:
        store.close()
    assert remote_rows(r.config.home) == []  # the row went with the child


def test_a_trusted_remote_leaves_the_parent_trusted(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("echo"), trusted=True)
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert outcome.content == "sub-mm-1 completed\necho: hello there"  # type: ignore[union-attr]
    r.finished()
    (result,) = [e for e in r.of(ToolCallFinished) if e.name == "subagent"]
    assert not result.untrusted


def test_a_data_part_is_json_text(agents: A2aAgents, run: Callable[..., Run]) -> None:
    r = run(agents.url("data"))
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    head, _, data = outcome.content.partition("\n")
    assert head == "sub-mm-1 completed" and json.loads(data) == {"n": 3, "ok": True}


def failed_detail(r: Run) -> str:
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert outcome == TurnCompleted("mm", "sub-mm-1 failed", usage=outcome.usage)
    finished = r.finished()
    assert not finished.completed and finished.reason is FailReason.REMOTE_ERROR
    return finished.detail


def test_a_failed_remote_task_fails_the_child_naming_state_and_message(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("fail"))
    detail = failed_detail(r)
    assert detail.startswith(f"remote agent {agents.url('fail')}: task ")
    assert detail.endswith("FAILED: it broke")
    r.stop()
    store = SessionStore(Path(r.config.home) / DB_NAME)
    try:  # the child's transcript names it too
        assert store.open("sub-mm-1").transcript[-1].content == f"failed: {detail}"
    finally:
        store.close()


def test_a_remote_that_asks_for_input_is_cancelled_and_the_child_fails_with_its_question(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("ask"))
    detail = failed_detail(r)
    assert detail.endswith("INPUT_REQUIRED: it asked for input: which one?")
    task_id = detail.split("task ", 1)[1].split(" ", 1)[0]
    agents.recorder.wait_cancelled(task_id)


@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("junk", "its agent card: not valid JSON"),
        ("old", "its agent card is A2A '0.3.0', not 1.0"),
        ("nowhere", "its agent card: HTTP 404"),
    ],
)
def test_a_remote_that_is_not_a2a_1_0_fails_the_child_at_once_naming_the_url(
    agents: A2aAgents, run: Callable[..., Run], name: str, what: str
) -> None:
    r = run(agents.url(name))
    detail = failed_detail(r)
    assert detail.startswith(f"remote agent {agents.url(name)}: {what}"), detail


def test_an_unreachable_remote_fails_the_child_naming_the_url(
    run: Callable[..., Run],
) -> None:
    with socket.socket() as held:  # bound, never listening: refused, and nobody else's port
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}/gone"
        detail = failed_detail(run(url))
    assert detail.startswith(f"remote agent {url}: it cannot be reached")


def test_headers_env_authenticates_and_its_value_is_never_told(
    agents: A2aAgents,
    run: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("LOOPD_TEST_A2A_KEY", "sekret")
    r = run(agents.url("secret"), headers_env={"X-Key": "LOOPD_TEST_A2A_KEY"})
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert outcome.content == "sub-mm-1 completed\necho: hello there"  # type: ignore[union-attr]
    assert agents.headers_seen[-1] == "sekret"  # sent with the card's read and every call
    r.finished()
    r.stop()
    monkeypatch.setenv("LOOPD_TEST_A2A_KEY", "wrong-value")
    wrong = run(agents.url("secret"), headers_env={"X-Key": "LOOPD_TEST_A2A_KEY"})
    detail = failed_detail(wrong)
    assert detail == f"remote agent {agents.url('secret')}: its agent card: HTTP 401"
    wrong.stop()
    # Every log record of this process but the test agents' own (their server logs headers).
    ours = [rec.getMessage() for rec in caplog.records if not rec.name.startswith("a2a.server")]
    told = repr(r.events) + repr(wrong.events) + "\n".join(ours)
    assert "sekret" not in told and "wrong-value" not in told


def test_an_unset_headers_env_variable_is_named(
    agents: A2aAgents, run: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOOPD_TEST_A2A_UNSET", raising=False)
    r = run(agents.url("secret"), headers_env={"X-Key": "LOOPD_TEST_A2A_UNSET"})
    detail = failed_detail(r)
    assert detail.endswith("the environment variable LOOPD_TEST_A2A_UNSET is not set (headers_env)")


def test_cancelling_the_parent_cancels_the_remote_task(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("slow"))
    before = len(agents.recorder.started)
    done = threading.Event()
    outcome: list[Any] = []

    def turn() -> None:
        outcome.append(r.runtime.run_turn("mm", "go", timeout=WAIT))
        done.set()

    threading.Thread(target=turn, daemon=True).start()
    task_id = _next_started(agents, before)
    _wait_row(r, task_id)
    r.runtime.cancel("mm")
    assert done.wait(WAIT)
    agents.recorder.wait_cancelled(task_id)
    r.stop()
    assert remote_rows(r.config.home) == []


def test_a_cancel_before_the_remote_gave_its_task_id_still_cancels_the_task(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    # The late agent answers SendMessage a second after its task started: the cancel comes
    # while the send is under way. The send is let finish, and the task it names cancelled.
    r = run(agents.url("late"))
    before = len(agents.recorder.started)
    done = threading.Event()

    def turn() -> None:
        r.runtime.run_turn("mm", "go", timeout=WAIT)
        done.set()

    threading.Thread(target=turn, daemon=True).start()
    task_id = _next_started(agents, before)  # started, its id not yet sent back
    assert r.runtime.cancel("mm") == ("mm", "sub-mm-1")
    assert done.wait(WAIT)
    agents.recorder.wait_cancelled(task_id)
    r.stop()
    assert remote_rows(r.config.home) == []


def test_child_timeout_cancels_the_remote_task(agents: A2aAgents, run: Callable[..., Run]) -> None:
    before = len(agents.recorder.started)
    r = run(agents.url("slow"), loop={"child_timeout_s": 3.0})
    outcome = r.runtime.run_turn("mm", "go", timeout=WAIT)
    assert outcome.content == "sub-mm-1 failed"  # type: ignore[union-attr]
    finished = r.finished()
    assert finished.reason is FailReason.TIMEOUT
    assert "loop.child_timeout_s" in finished.detail
    agents.recorder.wait_cancelled(_next_started(agents, before))


def _next_started(agents: A2aAgents, before: int) -> str:
    return agents.recorder.wait_started(WAIT, after=before)


def _wait_row(r: Run, task_id: str) -> None:
    """The remote task's id is stored (the row the next start would cancel)."""
    import time

    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        rows = remote_rows(r.config.home)
        if rows and rows[0][4] == task_id:
            assert rows[0][:3] == ("sub-mm-1", "mm", r.config.agents["far"].a2a_url)
            return
        time.sleep(0.02)
    raise AssertionError("the remote task's id was not stored")


# --- the configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "error"),
    [
        ({"a2a_url": "ftp://x"}, "agents.far.a2a_url"),
        ({"a2a_url": "http://h/a?q=1"}, "agents.far.a2a_url"),
        ({"headers_env": {"X": "V"}}, "agents.far.headers_env is for a remote agent"),
        ({"trusted": True}, "agents.far.trusted is for a remote agent"),
        ({"a2a_url": "http://h", "headers_env": {"X Y": "V"}}, "not an HTTP header name"),
        ({"a2a_url": "http://h", "headers_env": {"X": "1V"}}, "not an environment variable"),
        ({"a2a_url": "http://h", "output_schema": {"type": "object"}}, "answers text"),
    ],
)
def test_the_remote_keys_are_checked_naming_the_key(profile: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("?", r"\?")):
        Config(agents={"far": AgentConfig(**profile)})


def test_the_remote_keys_read_from_toml() -> None:
    config = Config.from_toml(
        '[agents.far]\na2a_url = "https://agents.example/a"\ntrusted = true\n'
        '[agents.far.headers_env]\nAuthorization = "FAR_TOKEN"\n'
    )
    far = config.agent("far")
    assert far.a2a_url == "https://agents.example/a" and far.trusted
    assert far.headers_env == {"Authorization": "FAR_TOKEN"}


# --- the pure decisions -----------------------------------------------------------------------


def test_card_interfaces_keeps_only_1_x_jsonrpc() -> None:
    one = {"url": "http://h/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    grpc = {"url": "http://h/", "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    old = {"url": "http://h/", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
    assert card_interfaces({"supportedInterfaces": [grpc, one, old]}) == [one]
    assert "no A2A 1.x JSON-RPC" in str(card_interfaces({"supportedInterfaces": [grpc, old]}))
    assert "not 1.0" in str(card_interfaces({"protocolVersion": "0.3.0", "url": "x"}))
    assert "not a JSON object" in str(card_interfaces([1]))


def test_task_step_reads_each_state() -> None:
    def task(state: str, said: str = "", artifacts: Any = ()) -> dict[str, Any]:
        status: dict[str, Any] = {"state": f"TASK_STATE_{state}"}
        if said:
            status["message"] = {"parts": [{"text": said}]}
        return {"id": "t", "status": status, "artifacts": list(artifacts)}

    assert not task_step(task("WORKING"), 100).done
    assert not task_step(task("SUBMITTED"), 100).done
    done = task_step(task("COMPLETED", artifacts=[{"parts": [{"text": "a"}, {"data": [1]}]}]), 9)
    assert done.completed and done.text == "a\n[1]"
    assert task_step(task("COMPLETED", "only said"), 100).text == "only said"
    assert task_step(task("FAILED", "boom"), 100).what == "FAILED: boom"
    assert task_step(task("REJECTED"), 100).what == "REJECTED"
    asked = task_step(task("INPUT_REQUIRED", "which?"), 100)
    assert asked.cancel and asked.what == "INPUT_REQUIRED: it asked for input: which?"
    assert task_step(task("COMPLETED", artifacts=[{"parts": [{"text": "x" * 50}]}]), 10).text == (
        "x" * 10
    )
    assert task_step("nope", 10).what == "it answered something that is not a task"


def test_parts_text_and_the_task_text() -> None:
    assert parts_text([{"text": "a"}, {"data": {"n": 2.0, "f": 0.5}}, {"url": "http://f"}]) == (
        'a\n{"n":2,"f":0.5}\n[file: http://f]'
    )
    assert remote_task_text("It is 2026-01-01T00:00:00Z.\n\nfind it") == "find it"
    assert remote_task_text("no clock\n\nhere") == "no clock\n\nhere"


# --- the store's rows ---------------------------------------------------------------------------


def test_remote_rows_are_stored_replaced_and_dropped(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / DB_NAME)
    try:
        row = RemoteTaskRow("sub-mm-1", "mm", "http://h/a", "ctx")
        store.run_batch([("sub-mm-1", lambda cur: store.save_remote_in(cur, row))])
        assert store.remote_tasks() == (row,)
        known = RemoteTaskRow("sub-mm-1", "mm", "http://h/a", "ctx", "task-9")
        store.run_batch([("sub-mm-1", lambda cur: store.save_remote_in(cur, known))])
        assert store.remote_tasks() == (known,)
        store.run_batch([("sub-mm-1", lambda cur: store.drop_remote_in(cur, "sub-mm-1"))])
        assert store.remote_tasks() == ()
    finally:
        store.close()


def test_a_version_5_store_gains_the_remote_tasks_table(tmp_path: Path) -> None:
    SessionStore(tmp_path / DB_NAME).close()
    with sqlite3.connect(tmp_path / DB_NAME) as raw:  # version 5's: all but remote_tasks
        raw.execute("DROP TABLE remote_tasks")
        raw.execute("PRAGMA user_version = 5")
    store = SessionStore(tmp_path / DB_NAME)
    try:
        assert store.remote_tasks() == ()
        row = RemoteTaskRow("sub-p-1", "p", "http://h/a", "ctx-1")
        store.run_batch([("sub-p-1", lambda cur: store.save_remote_in(cur, row))])
        assert store.remote_tasks() == (row,)
    finally:
        store.close()
    with sqlite3.connect(tmp_path / DB_NAME) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (6,)


def test_a_top_level_turn_with_a_remote_profile_fails_wrong_agent(
    agents: A2aAgents, run: Callable[..., Run]
) -> None:
    r = run(agents.url("echo"))
    before = len(agents.recorder.started)
    with pytest.raises(ValueError, match=r"is a remote agent .* only a subagent call runs it"):
        r.runtime.run_turn("top", "hi", timeout=WAIT, agent="far")
    assert len(agents.recorder.started) == before  # nothing was sent


def test_with_headers_env_a_card_pointing_elsewhere_is_refused() -> None:
    here = {"url": "http://h:80/a/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    there = {"url": "http://evil.example/a/", "protocolBinding": "JSONRPC", "protocolVersion": "1"}
    assert on_origin([there, here], "http://H/a") == [here]
    refused = on_origin([there], "http://h/a")
    assert isinstance(refused, str) and "'http://evil.example/a/' is on another origin" in refused


def test_the_cli_line_of_a_remote_failure_names_its_reason() -> None:
    from actors.shells.render import render_event

    failed = SubagentFinished(
        session="mm",
        call_id=1,
        child="sub-mm-1",
        completed=False,
        reason=FailReason.REMOTE_ERROR,
        detail="remote agent http://h/a: its agent card: HTTP 401",
    )
    assert render_event(failed).endswith(
        "┴ sub-mm-1 failed (remote_error): remote agent http://h/a: its agent card: HTTP 401"
    )
    local = SubagentFinished(
        session="mm", call_id=1, child="sub-mm-1", completed=False, reason=FailReason.CRASHED
    )
    assert render_event(local).endswith("┴ sub-mm-1 failed (crashed)")
