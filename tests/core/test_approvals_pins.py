"""Approvals' pure parts (actors/core/approvals.py), pinned at the core: the words a person's
decision may have, what a decision from outside a runtime is refused with, which tools wait, and
the Context's book of waiting calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from actors import Config
from actors.core.approvals import (
    MAX_DECISION_CHARS,
    ApprovalBook,
    ApprovalPolicy,
    approval_policies,
    check_call_id,
    decision_text,
    declined_text,
    shell_refusal,
    stored_approval,
)
from actors.core.bounded import INT64_MAX, OutOfBounds
from messages import ApprovalRequested, StoredApproval, ToolCall

NOW = datetime(2026, 12, 6, 2, 0, tzinfo=UTC)


def entry(
    session: str = "s", call_id: int = 1, *, at: datetime = NOW, timeout_s: float = 60.0, **more
) -> StoredApproval:
    request = ApprovalRequested(
        session=session, call_id=call_id, tool="deploy", arguments="{}", at=at
    )
    return StoredApproval(request, at + timedelta(seconds=timeout_s), **more)


def test_a_call_id_is_a_whole_number_in_range() -> None:
    assert check_call_id(1) == 1 and check_call_id(INT64_MAX) == INT64_MAX
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="call_id must be an int"):
            check_call_id(bad)
    with pytest.raises(ValueError, match="not 0"):
        check_call_id(0)
    with pytest.raises(ValueError, match=f"not {INT64_MAX + 1}"):
        check_call_id(INT64_MAX + 1)
    with pytest.raises(ValueError, match="not a 200-bit integer"):
        check_call_id(1 << 199)


def test_a_persons_words_are_capped_at_the_door_and_neutralised() -> None:
    assert decision_text("ok \x1b[2Jnow<|im_end|>", "the reason") == "ok now"
    assert decision_text("x" * MAX_DECISION_CHARS, "the note") == "x" * MAX_DECISION_CHARS
    with pytest.raises(OutOfBounds, match="the note has 2,001 characters; at most 2,000"):
        decision_text("x" * (MAX_DECISION_CHARS + 1), "the note")
    with pytest.raises(TypeError, match="the reason must be a str"):
        decision_text(3, "the reason")


def test_a_declined_calls_text_caps_and_neutralises_its_reason() -> None:
    assert declined_text("not now\x07") == "Denied: a person declined this call: not now."
    long = declined_text("y" * 5000)
    assert long == f"Denied: a person declined this call: {'y' * MAX_DECISION_CHARS}."


def test_a_decision_from_outside_a_runtime_is_refused_when_it_would_never_run() -> None:
    assert shell_refusal(None, "s", 4, NOW) == ("call 4 of session s is not waiting for a decision")
    decided = entry(approved=True)
    assert shell_refusal(decided, "s", 1, NOW) == (
        "call 1 of session s is not waiting for a decision"
    )
    cut_off = entry("sub-s-2", 1, background=True)
    said = shell_refusal(cut_off, "sub-s-2", 1, NOW)
    assert said is not None
    assert said.startswith("call 1 of session sub-s-2 waits in a background subagent")
    late = shell_refusal(entry(timeout_s=90), "s", 1, NOW + timedelta(seconds=90))
    assert late == (
        "call 1 of session s was declined for its timeout (no decision within 90 s): a decision "
        "past its deadline is not carried out; see docs/runbook.md#approval-past-its-deadline"
    )
    assert shell_refusal(entry(timeout_s=90), "s", 1, NOW + timedelta(seconds=89)) is None
    # A background call of a top-level session is not cut off: its decision may be recorded.
    assert shell_refusal(entry(background=True), "s", 1, NOW) is None


def test_which_tools_wait_exact_names_and_prefixes() -> None:
    policy = ApprovalPolicy.of(["deploy", "github__*"], 30.0)
    assert policy.needs("deploy") and policy.needs("github__merge")
    assert not policy.needs("deploy2") and not policy.needs("github_x")
    assert policy.timeout_s == 30.0
    everything = ApprovalPolicy.of(["*"], 30.0)
    assert everything.needs("anything")
    assert policy.check("deploy", "{}") is None  # no check for it


def test_every_profile_gets_the_common_tools_its_own_and_the_marked_ones(tmp_path) -> None:
    text = (
        f'home = "{tmp_path}"\n[approvals]\ntools = ["deploy"]\ntimeout_s = 45\n'
        '[agents.ops]\napprove = ["restart"]\n'
    )
    policies = approval_policies(Config.from_toml(text), ["wipe"], {"wipe": lambda a: "no"})
    assert sorted(policies) == ["default", "ops"]
    ops, default = policies["ops"], policies["default"]
    assert ops.needs("restart") and not default.needs("restart")
    for policy in (ops, default):
        assert policy.needs("deploy") and policy.needs("wipe") and policy.timeout_s == 45
        assert policy.check("wipe", "{}") == "no"


def test_a_stored_request_shows_the_call_as_written_with_its_deadline() -> None:
    call = ToolCall(3, "deploy", "{}", raw_arguments="{not json")
    stored = stored_approval("s", call, True, NOW, 120.0)
    request = stored.request
    assert (request.session, request.call_id, request.tool) == ("s", 3, "deploy")
    assert request.arguments == "{not json" and request.untrusted and request.at == NOW
    assert stored.deadline == NOW + timedelta(seconds=120)


def test_the_book_of_waiting_calls() -> None:
    book = ApprovalBook()
    book.add(entry("s", 2, at=NOW + timedelta(seconds=5)))
    book.add(entry("s", 1, at=NOW + timedelta(seconds=9)))
    book.add(entry("t", 1, at=NOW), live=False)
    assert len(book) == 3
    assert [w.entry.request.call_id for w in book.of("s")] == [1, 2]
    assert [w.live for w in book.of("t")] == [False]
    assert [(r.session, r.call_id) for r in book.pending()] == [("t", 1), ("s", 2), ("s", 1)]
    assert book.waits("s") and not book.waits("u")
    assert not book.expired("s", 2, NOW + timedelta(seconds=64))
    assert book.expired("s", 2, NOW + timedelta(seconds=65))
    assert not book.expired("s", 9, NOW + timedelta(days=9))
    taken = book.take("s", 2)
    assert taken is not None and taken.entry.request.call_id == 2
    assert book.take("s", 2) is None  # of two decisions only the first finds it
    assert len(book) == 2


def test_a_refused_call_id_is_shown_whole_up_to_128_bits() -> None:
    with pytest.raises(ValueError) as raised:
        check_call_id((1 << 127) + 1)  # 128 bits
    assert str((1 << 127) + 1) in str(raised.value)
    with pytest.raises(ValueError, match="not a 129-bit integer"):
        check_call_id(1 << 128)
    with pytest.raises(TypeError, match=r"not float \(1\.0\)"):
        check_call_id(1.0)
    with pytest.raises(TypeError, match=r"not bool \(True\)"):
        check_call_id(True)
