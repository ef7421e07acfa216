"""The data behind the console (issue 35): ApprovalSettled's note and reason, a decision and
an untrusted result kept with the stored result, a typed turn's output in TurnEnded, one usage
entry per turn, no slot where the server has none, and the state vocabulary."""

from __future__ import annotations

import io
import threading
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors import AgentConfig, Config, SubagentsConfig, port_tool
from actors.core.usage import format_usage
from actors.runtime import Runtime
from actors.shells.views import (
    session_listing,
    sessions_table,
    show_session,
    turn_outputs,
    turn_usage,
)
from actors.stores.reader import StoreReader
from actors.stores.sqlite import DB_NAME
from actors.testing import ScriptedModel, call, calls, reply, with_usage
from messages import (
    ApprovalRequested,
    ApprovalSettled,
    CallDecision,
    ModelRequest,
    ModelRequestSent,
    SubagentFinished,
    TurnEnded,
    TurnEvent,
    TurnStarted,
    Usage,
)

pytestmark = pytest.mark.timeout(60)
WAIT = 20.0


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


@port_tool(untrusted=True)
def fetch(url: str) -> str:
    """Fetch a page.

    Args:
        url: Which.
    """
    return "some page text"


def _deploy_script(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":
        return with_usage(calls(("fetch", {"url": "u"}), ("deploy", {"env": "prod"})), 10, 2)
    return with_usage(reply("done"), 20, 3)


class _Events:
    def __init__(self, rt: Runtime) -> None:
        self.seen: list[TurnEvent] = []
        self.cond = threading.Condition()
        rt.subscribe(self._see)

    def _see(self, event: TurnEvent) -> None:
        with self.cond:
            self.seen.append(event)
            self.cond.notify_all()

    def wait(self, what: Any) -> Any:
        with self.cond:
            assert self.cond.wait_for(lambda: any(what(e) for e in self.seen), WAIT), self.seen
            return next(e for e in self.seen if what(e))


def _store(home: Path) -> StoreReader:
    return StoreReader(home / DB_NAME)


@pytest.mark.parametrize("approve", [True, False])
def test_a_decision_is_in_approval_settled_and_stays_with_the_stored_result(
    tmp_path: Path, approve: bool
) -> None:
    home = tmp_path / "home"
    with Runtime.start(
        Config(home=str(home)), model=ScriptedModel(_deploy_script), tools=[deploy, fetch]
    ) as rt:
        events = _Events(rt)
        rt.send_turn("ops", "ship")
        events.wait(lambda e: isinstance(e, ApprovalRequested))
        if approve:
            settled = rt.approve("ops", 2, note="on-call said yes")
        else:
            settled = rt.deny("ops", 2, "not on a Friday")
        events.wait(lambda e: isinstance(e, TurnEnded))
    assert isinstance(settled, ApprovalSettled)
    if approve:
        assert (settled.note, settled.reason) == ("on-call said yes", None)
        decision = CallDecision(approved=True, note="on-call said yes")
    else:
        assert (settled.note, settled.reason) == (None, "not on a Friday")
        decision = CallDecision(approved=False, reason="not on a Friday")
    with _store(home) as store:
        # Each result is stored as it comes (the denied call's may come first): by call id.
        tools = sorted(
            (m.message for m in store.history("ops") if m.message.role == "tool"),
            key=lambda t: t.tool_call_id or 0,
        )
        assert [(t.tool_call_id, t.untrusted, t.decision) for t in tools] == [
            (1, True, None),  # fetch's result is untrusted; nobody was asked
            (2, False, decision),
        ]
        assert turn_usage(store, "ops") == [
            (Usage(30, 5, 0, 2), Usage(30, 5, 0, 2))  # one turn, one entry
        ]
        out = io.StringIO()
        with redirect_stdout(out):
            show_session(store, "ops")
    text = out.getvalue()
    assert "(untrusted)" in text
    expected = "approved (note: on-call said yes)" if approve else "declined: not on a Friday"
    assert expected in text


def test_an_approval_settled_stored_before_note_and_reason_decodes() -> None:
    old = (
        b'{"type":"ApprovalSettled","session":"s","call_id":1,"approved":true,'
        b'"at":"2026-01-01T00:00:00Z"}'
    )
    settled = msgspec.json.decode(old, type=ApprovalSettled)
    assert settled.note is None and settled.reason is None
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(settled), type=ApprovalSettled) == settled


def test_a_typed_turn_ends_with_its_output_and_one_usage_entry_despite_a_nudge(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    schema = {"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]}

    def script(request: ModelRequest) -> Any:
        if request.messages[-1].content == "plan":
            return with_usage(reply("here it is in text"), 5, 1)  # nudged: a failed try
        return with_usage(call("final_answer", host="web-1"), 7, 2)

    config = Config(home=str(home), agents={"typed": AgentConfig(output_schema=schema)})
    with Runtime.start(config, model=ScriptedModel(script)) as rt:
        events = _Events(rt)
        outcome = rt.run_turn("t", "plan", agent="typed", timeout=WAIT)
        ended = events.wait(lambda e: isinstance(e, TurnEnded))
    assert outcome.output == {"host": "web-1"}
    assert ended.output == {"host": "web-1"}
    assert msgspec.json.decode(msgspec.json.encode(ended), type=TurnEnded) == ended
    with _store(home) as store:
        assert len(turn_usage(store, "t")) == 1  # the nudge is not a turn of its own
        assert turn_outputs(store.history("t")) == [{"host": "web-1"}]


CHILD_DONE = threading.Event()


@port_tool
def wait_for_child() -> str:
    """Return once the background child has finished (its report then waits for the turn)."""
    CHILD_DONE.wait(WAIT)
    return "it finished"


def test_a_background_report_into_a_running_turn_is_not_a_turn_of_its_own(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    CHILD_DONE.clear()

    def script(request: ModelRequest) -> Any:
        if request.session.startswith("sub-"):
            return with_usage(reply("found it"), 3, 1)
        last = request.messages[-1]
        if last.role == "user" and last.content == "go":
            return with_usage(call("subagent", task="look", background=True), 4, 1)
        if last.role == "tool" and last.content and "background" in last.content:
            return with_usage(call("wait_for_child"), 5, 1)
        return with_usage(reply("the child said it"), 6, 1)

    config = Config(home=str(home), subagents=SubagentsConfig(background=True))
    with Runtime.start(config, model=ScriptedModel(script), tools=[wait_for_child]) as rt:
        rt.subscribe(lambda e: CHILD_DONE.set() if isinstance(e, SubagentFinished) else None)
        outcome = rt.run_turn("p", "go", timeout=WAIT)
    assert outcome.content == "the child said it"
    with _store(home) as store:
        history = [m.message for m in store.history("p")]
        report = next(m for m in history if m.role == "user" and m.name == "subagent")
        assert history[history.index(report) - 1].role == "tool"  # inside the running turn
        assert store.open("p").turns == 1
        assert turn_usage(store, "p") == [(Usage(15, 3, 0, 3), Usage(18, 4, 0, 4))]


def test_events_name_no_slot_where_the_server_has_none(tmp_path: Path) -> None:
    config = Config(home=str(tmp_path / "home"))
    config = config.replace(model=msgspec.structs.replace(config.model, backend="openai"))
    with Runtime.start(config, model=ScriptedModel(lambda r: reply("hi"))) as rt:
        events = _Events(rt)
        rt.run_turn("s", "hello", timeout=WAIT)
        events.wait(lambda e: isinstance(e, TurnEnded))
        with _store(Path(config.home)) as store:
            rows = session_listing(store, config)
    started = [e for e in events.seen if isinstance(e, TurnStarted | ModelRequestSent)]
    assert started and all(e.slot is None for e in started)
    assert rows[0]["slot"] is None


def test_the_listing_speaks_the_state_vocabulary_and_usage_nobody_measured_is_unknown(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with Runtime.start(
        Config(home=str(home)), model=ScriptedModel(_deploy_script), tools=[deploy, fetch]
    ) as rt:
        events = _Events(rt)
        rt.send_turn("ops", "ship")
        events.wait(lambda e: isinstance(e, ApprovalRequested))
        with _store(home) as store:
            rows = {r["session"]: r for r in session_listing(store)}
        assert rows["ops"]["state"] == "waiting" and rows["ops"]["background"] is False
        assert "waiting" in sessions_table(list(rows.values()))
        rt.approve("ops", 2)
        events.wait(lambda e: isinstance(e, TurnEnded))
    with _store(home) as store:
        rows = {r["session"]: r for r in session_listing(store)}
    assert rows["ops"]["state"] == "completed"
    assert format_usage(Usage(requests=3, unmeasured_requests=3)) == (
        "unknown tokens, 3 requests (none measured)"
    )


def test_the_live_lines_name_no_slot_where_there_is_none_and_say_the_note() -> None:
    from actors.shells.render import render_event

    assert render_event(TurnStarted(session="s", slot=None)).endswith("s  turn started")
    assert render_event(ModelRequestSent(session="s", slot=None, step=1)).endswith("request 1")
    settled = ApprovalSettled(session="s", call_id=2, approved=True, note="ok by me")
    assert render_event(settled).endswith("call 2 approved: ok by me")
    declined = ApprovalSettled(session="s", call_id=2, approved=False, reason="not today")
    assert render_event(declined).endswith("call 2 declined: not today")
