"""Compaction end to end: the real store keeps the old messages, marked; children compact by
the same rule; a failed compaction never fails the turn."""

from __future__ import annotations

from actors import ModelFailure
from actors.core.turn import COMPACT_INSTRUCTION, SUMMARY_PREFIX
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import Probe, call, reply
from messages import Compacted, CompactionFailed, ModelRequest, TurnCompleted

WAIT = 10.0


def summarising(answer_for_turn):
    """A script that answers summary requests with a summary of who asked."""

    def script(request: ModelRequest):
        if request.messages[-1].content == COMPACT_INSTRUCTION:
            return reply(f"summary of {request.session}")
        return answer_for_turn(request)

    return script


def test_a_long_transcript_is_compacted_and_the_old_messages_are_kept(
    loopd_runtime, loopd_config
) -> None:
    rt = loopd_runtime(summarising(lambda r: reply("x" * 30)), compact={"threshold_chars": 50})
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    assert rt.run_turn("s", "y" * 30, timeout=WAIT) == TurnCompleted("s", "x" * 30)
    compacted = events.expect(Compacted)
    assert (compacted.session, compacted.before) == ("s", 60)
    summary_request = rt.model.requests[1]
    assert summary_request.slot == loopd_config.slots.main
    rt.run_turn("s", "next", timeout=WAIT)
    after = rt.model.requests[2]
    assert [m.content for m in after.messages[1:]] == [SUMMARY_PREFIX + "summary of s", "next"]
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        history = [(h.message.content, h.compacted) for h in store.history("s")]
    # Nothing is deleted: each compaction marks the live history and appends its summary.
    assert history == [
        ("y" * 30, True),
        ("x" * 30, True),
        (SUMMARY_PREFIX + "summary of s", True),
        ("next", True),
        ("x" * 30, True),
        (SUMMARY_PREFIX + "summary of s", False),
    ]
    events.stop()


def test_a_child_compacts_on_its_own_slot_before_it_answers(loopd_runtime) -> None:
    def turn(request: ModelRequest):
        if request.session == "p" and request.messages[-1].role == "user":
            return call("subagent", task="t" * 10)
        if request.session == "p":
            return reply("parent done")
        return reply("c" * 60)

    rt = loopd_runtime(summarising(turn), compact={"threshold_chars": 80})
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    outcome = rt.run_turn("p", "go", timeout=WAIT)
    assert outcome == TurnCompleted("p", "parent done")
    assert events.expect(Compacted).session == "sub-p-1"
    child_summary = next(
        r
        for r in rt.model.requests
        if r.session == "sub-p-1"
        and r.messages[-1].role == "user"
        and r.messages[-1].content == COMPACT_INSTRUCTION
    )
    assert child_summary.slot == rt.config.slots.background
    # The parent's tool text is the child's answer, not its compaction summary.
    parent_after = next(
        r for r in rt.model.requests if r.session == "p" and r.messages[-1].role == "tool"
    )
    assert parent_after.messages[-1].content == "sub-p-1 completed\n" + "c" * 60
    events.stop()


def test_a_failed_compaction_does_not_fail_the_turn(loopd_runtime, loopd_config) -> None:
    def script(request: ModelRequest):
        if request.messages[-1].content == COMPACT_INSTRUCTION:
            raise ModelFailure("the model at http://x answered HTTP 503")
        return reply("z" * 60)

    rt = loopd_runtime(script, compact={"threshold_chars": 50})
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    assert rt.run_turn("s", "hello", timeout=WAIT) == TurnCompleted("s", "z" * 60)
    failed = events.expect(CompactionFailed)
    assert "HTTP 503" in failed.detail
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        assert [m.content for m in store.open("s").transcript] == ["hello", "z" * 60]
    events.stop()
