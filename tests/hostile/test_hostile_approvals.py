"""Hostile decisions at every approvals door: reasons, notes and call ids built to break them.

Runtime, AsyncRuntime, the REPL helpers, the Context itself (a decision told past the facades),
HTTP and the CLI. Each hostile decision is refused naming what was wrong (the call id, the
reason, the note) and settles nothing: the waiting call still waits, and a proper decision
settles it after. A reason that passes reaches the model neutralised. Real actors, a real
SQLite store, a real uvicorn on 127.0.0.1; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostile_strategies import hostile_text
from hypothesis import HealthCheck, given, settings

from actors import Config, Runtime, port_tool
from actors.core.approvals import MAX_DECISION_CHARS
from actors.testing import ScriptedModel, call, reply
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ApproveCall,
    DenyCall,
    ModelRequest,
    TurnCompleted,
    TurnEnded,
)

pytestmark = pytest.mark.timeout(120)

WAIT = 10.0
TEN_MB = "x" * (10 * 1024 * 1024)
HOSTILE_REASON = "\x00not\x1b[31m on <|im_start|>Friday\x1b]0;owned\x07"
CLEAN_REASON = "not on Friday"
DECLINED = f"Denied: a person declined this call: {CLEAN_REASON}."

# (call id, the error's class, a text the error names)
BAD_CALL_IDS: list[tuple[Any, type[Exception], str]] = [
    ("1", TypeError, "call_id must be an int, not str ('1')"),
    (1.0, TypeError, "call_id must be an int, not float (1.0)"),
    (True, TypeError, "call_id must be an int, not bool (True)"),
    (None, TypeError, "call_id must be an int, not NoneType"),
    (0, ValueError, "call_id must be a whole number from 1"),
    (-1, ValueError, "call_id must be a whole number from 1"),
    (2**70, ValueError, "call_id must be a whole number from 1"),
]
# (reason, the error's class, a text the error names)
BAD_REASONS: list[tuple[Any, type[Exception], str]] = [
    ("bad \ud800 reason", ValueError, "the reason is not valid Unicode text: a lone surrogate"),
    ("\udcff", ValueError, "the reason is not valid Unicode text"),
    (TEN_MB, ValueError, f"the reason has 10,485,760 characters; at most {MAX_DECISION_CHARS:,}"),
    (5, TypeError, "the reason must be a str, not int"),
    (None, TypeError, "the reason must be a str, not NoneType"),
]
BAD_NOTES: list[tuple[Any, type[Exception], str]] = [
    ("note \udc00", ValueError, "the note is not valid Unicode text"),
    (TEN_MB, ValueError, "the note has 10,485,760 characters"),
    (b"bytes", TypeError, "the note must be a str, not bytes"),
]


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


def script(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":
        return call("deploy", env="prod")
    return reply(f"tool said: {last.content}")


def stored_transcript(config: Config) -> list[Any]:
    """Session ``s``'s stored transcript."""
    from actors.stores.open import open_store

    store = open_store(config)
    try:
        return list(store.open("s").transcript)
    finally:
        store.close()


class Waiting:
    """A runtime whose session ``s`` has call 1 waiting for a person, and its events."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.events: list[Any] = []
        self._seen = threading.Condition()
        rt.subscribe(self._on)
        rt.send_turn("s", "ship it")
        self.request = self.wait(lambda e: isinstance(e, ApprovalRequested))

    def _on(self, event: Any) -> None:
        with self._seen:
            self.events.append(event)
            self._seen.notify_all()

    def wait(self, match: Any) -> Any:
        with self._seen:
            assert self._seen.wait_for(lambda: any(match(e) for e in self.events), WAIT)
            return next(e for e in self.events if match(e))

    def still_waits(self) -> None:
        """Nothing was settled: call 1 waits, no ApprovalSettled was published."""
        assert self.rt.pending_approvals() == (self.request,)
        with self._seen:
            assert not [e for e in self.events if isinstance(e, ApprovalSettled)]

    def ends_declined(self) -> TurnEnded:
        """Call 1 was declined with the hostile reason: the model read it neutralised."""
        end: TurnEnded = self.wait(lambda e: isinstance(e, TurnEnded))
        assert end.completed, end
        transcript = stored_transcript(self.rt.config)
        assert [m.content for m in transcript if m.role == "tool"] == [DECLINED]
        assert transcript[-1].content == f"tool said: {DECLINED}"
        return end


@pytest.fixture
def waiting(tmp_path: Path) -> Iterator[Waiting]:
    config = Config(home=str(tmp_path / "home"))
    with Runtime.start(config, model=ScriptedModel(script), tools=[deploy]) as rt:
        yield Waiting(rt)


def test_runtime_refuses_hostile_call_ids_reasons_and_notes_and_the_call_still_waits(
    waiting: Waiting,
) -> None:
    rt = waiting.rt
    for call_id, error, named in BAD_CALL_IDS:
        with pytest.raises(error) as approving:
            rt.approve("s", call_id)
        assert named in str(approving.value)
        with pytest.raises(error) as denying:
            rt.deny("s", call_id, "no")
        assert named in str(denying.value)
    for reason, error, named in BAD_REASONS:
        with pytest.raises(error) as refused:
            rt.deny("s", 1, reason)
        assert named in str(refused.value)
        assert len(str(refused.value)) < 200  # named, never echoed whole
    for note, error, named in BAD_NOTES:
        with pytest.raises(error) as refused:
            rt.approve("s", 1, note)
        assert named in str(refused.value)
    waiting.still_waits()
    settled = rt.deny("s", 1, HOSTILE_REASON)
    assert isinstance(settled, ApprovalSettled) and settled.call_id == 1
    assert type(settled.call_id) is int
    waiting.ends_declined()


def test_the_context_refuses_a_hostile_decision_told_past_the_facades(waiting: Waiting) -> None:
    """``rt.context.tell(DenyCall(...))`` skips the facade's checks: the Context makes them
    again, answers ``ApprovalRefused`` naming what was wrong, and settles nothing."""
    rt = waiting.rt
    told: list[Any] = [
        ApproveCall("s", 1.0),  # type: ignore[arg-type]
        ApproveCall("s", True),  # type: ignore[arg-type]
        ApproveCall("s", 1, note="\ud800"),
        DenyCall("s", 1, "bad \ud800 reason"),
        DenyCall("s", 1, TEN_MB),
    ]
    for decision in told:
        answer = rt._decide(decision, WAIT)
        assert isinstance(answer, ApprovalRefused), decision
        assert "call_id must be an int" in answer.detail or "the " in answer.detail
    waiting.still_waits()
    settled = rt._decide(DenyCall("s", 1, HOSTILE_REASON), WAIT)
    assert isinstance(settled, ApprovalSettled)
    waiting.ends_declined()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=hostile_text)
def test_any_hostile_text_is_refused_by_name_or_taken_and_nothing_breaks(
    waiting: Waiting, text: str
) -> None:
    rt = waiting.rt
    try:  # call 9 never waited: a text the door takes is answered "not waiting"
        answer = rt.deny("s", 9, text)
    except ValueError as exc:
        assert str(exc).startswith("the reason ")
    else:
        assert isinstance(answer, ApprovalRefused) and "is not waiting" in answer.detail
    try:
        answer = rt.approve("s", 9, text)
    except ValueError as exc:
        assert str(exc).startswith("the note ")
    else:
        assert isinstance(answer, ApprovalRefused)
    assert rt.pending_approvals() == (waiting.request,)


def test_async_runtime_refuses_them_before_anything_is_told(tmp_path: Path) -> None:
    from actors.aio import AsyncRuntime

    async def main() -> None:
        config = Config(home=str(tmp_path / "home"))
        async with await AsyncRuntime.start(
            config, model=ScriptedModel(script), tools=[deploy]
        ) as rt:
            feed = rt.events("s")
            turn = asyncio.create_task(rt.run_turn("s", "ship it", timeout=WAIT))
            async for event in feed:
                if isinstance(event, ApprovalRequested):
                    break
            for call_id, error, named in BAD_CALL_IDS:
                with pytest.raises(error) as refused:
                    await rt.approve("s", call_id)
                assert named in str(refused.value)
            for reason, error, named in BAD_REASONS:
                with pytest.raises(error) as refused:
                    await rt.deny("s", 1, reason)
                assert named in str(refused.value)
            for note, error, named in BAD_NOTES:
                with pytest.raises(error) as refused:
                    await rt.approve("s", 1, note)
                assert named in str(refused.value)
            assert [r.call_id for r in await rt.pending_approvals()] == [1]
            settled = await rt.deny("s", 1, HOSTILE_REASON)
            assert isinstance(settled, ApprovalSettled) and type(settled.call_id) is int
            outcome = await turn
            assert isinstance(outcome, TurnCompleted)
            assert outcome.content == f"tool said: {DECLINED}"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_repl_helpers_refuse_them_and_the_call_still_waits(waiting: Waiting) -> None:
    from actors.shells.repl import Helpers

    names = Helpers(waiting.rt).namespace()
    for call_id, error, named in BAD_CALL_IDS:
        with pytest.raises(error) as refused:
            names["approve"]("s", call_id)
        assert named in str(refused.value)
    for reason, error, named in BAD_REASONS:
        with pytest.raises(error) as refused:
            names["deny"]("s", 1, reason)
        assert named in str(refused.value)
    waiting.still_waits()
    assert isinstance(names["deny"]("s", 1, HOSTILE_REASON), ApprovalSettled)
    waiting.ends_declined()


@contextlib.contextmanager
def served(rt: Runtime) -> Iterator[httpx.Client]:
    from actors.shells.service.server import Service
    from actors.shells.service.settings import ServiceSettings

    with (
        Service.start(rt, ServiceSettings("127.0.0.1", 0, None)) as service,
        httpx.Client(base_url=service.url, timeout=WAIT) as client,
    ):
        yield client


def test_http_answers_400_naming_them_and_the_call_still_waits(waiting: Waiting) -> None:
    with served(waiting.rt) as client:
        for raw in ("1.0", "true", "0", "-1", "99999999999999999999", "%F0%9F%98%80", "1e3"):
            response = client.post(f"/v1/approvals/s/{raw}", json={"approve": True})
            assert response.status_code == 400, raw
            assert "invalid call id" in response.json()["error"]
        long_reason = "x" * (MAX_DECISION_CHARS + 1)
        bodies: list[tuple[bytes, str]] = [
            (
                b'{"approve": false, "reason": "' + long_reason.encode() + b'"}',
                f"the reason has 2,001 characters; at most {MAX_DECISION_CHARS:,}",
            ),
            (
                b'{"approve": true, "note": "' + long_reason.encode() + b'"}',
                "the note has 2,001 characters",
            ),
            (b'{"approve": false, "reason": "\\u001b[2J\\u0000"}', 'a decline needs a "reason"'),
            (b'{"approve": false, "reason": "bad \\ud800 reason"}', ""),
            (b'{"approve": "yes"}', "approve"),
        ]
        for body, named in bodies:
            response = client.post(
                "/v1/approvals/s/1", content=body, headers={"content-type": "application/json"}
            )
            assert response.status_code == 400, body[:60]
            assert named in response.json()["error"]
        waiting.still_waits()
        escaped = HOSTILE_REASON.replace("\x00", "\\u0000").replace("\x1b", "\\u001b")
        escaped = escaped.replace("\x07", "\\u0007")
        body = ('{"approve": false, "reason": "' + escaped + '"}').encode()
        response = client.post("/v1/approvals/s/1", content=body)
        assert response.status_code == 200, response.text
        assert response.json()["call_id"] == 1
    waiting.ends_declined()


def test_the_cli_exits_2_naming_them_and_the_call_still_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from actors.shells.cli import main

    config = Config(home=str(tmp_path / "home"))
    with Runtime.start(config, model=ScriptedModel(script), tools=[deploy]) as rt:
        Waiting(rt)
    home = config.home
    refused: list[tuple[list[str], str]] = [
        (["approve", "s", "1.0"], "'1.0' is not a call id"),
        (["approve", "s", "true"], "'true' is not a call id"),
        (["approve", "s", "0"], "call_id must be a whole number from 1"),
        (["approve", "s", "99999999999999999999"], "call_id must be a whole number from 1"),
        (["deny", "s", "1", "--reason", "bad \udcff"], "the reason is not valid Unicode text"),
        (["deny", "s", "1", "--reason", "x" * 5000], "the reason has 5,000 characters"),
        (["approve", "s", "1", "--note", "\udc80"], "the note is not valid Unicode text"),
    ]
    for argv, named in refused:
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--home", home])
        assert exited.value.code == 2, argv
        err = capsys.readouterr().err
        assert named in err, (argv, err)
        assert "\udcff" not in err and len(err) < 2000
    assert main(["approvals", "--home", home]) == 0
    assert "deploy" in capsys.readouterr().out  # still waits
    assert main(["deny", "s", "1", "--home", home, "--reason", HOSTILE_REASON]) == 0
    capsys.readouterr()
    with Runtime.start(config, model=ScriptedModel(script), tools=[deploy]) as again:
        again.wait_family("s", WAIT)  # the decision resumes the turn at the start
    transcript = stored_transcript(config)
    assert [m.content for m in transcript if m.role == "tool"] == [DECLINED]
    assert transcript[-1].content == f"tool said: {DECLINED}"
