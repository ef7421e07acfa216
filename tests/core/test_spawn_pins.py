"""The pure parts of starting a child and hearing back from it (actors/core/spawn.py), pinned
at the core: the denials a parent's ``subagent`` call gets at each limit (``loop.max_depth``,
``loop.max_children``, a background call from a child, an id too long), the child's first
text, what the parent sees of the child's answer, and the baseline's memory block."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from actors.core.dispatch import Answered, Registry, SpawnChild
from actors.core.limits import Limits
from actors.core.spawn import (
    CHILD_BACKGROUND,
    MEMORY_HEADING,
    build_baseline,
    child_summary,
    child_text,
    report_message,
    spawn_check,
    subagent_result_text,
)
from messages import (
    BackgroundReport,
    DenyReason,
    FailReason,
    SubagentCompleted,
    SubagentFailed,
    denial_message,
)

LIMITS = Limits(
    max_steps=8,
    tool_result_cap=1000,
    summary_chars=100,
    threshold_chars=10_000,
    max_depth=2,
    max_children=3,
)


def test_a_child_one_level_under_the_depth_limit_starts() -> None:
    assert spawn_check("mm", 1, SpawnChild("t"), 1, LIMITS) == "sub-mm-1"
    assert spawn_check("sub-mm-1", 4, SpawnChild("t"), 1, LIMITS) == "sub-sub-mm-1-4"


def test_a_child_past_max_depth_is_denied_naming_its_depth_and_the_key() -> None:
    got = spawn_check("sub-sub-mm-1-4", 2, SpawnChild("t"), 1, LIMITS)
    detail = "sub-sub-sub-mm-1-4-2 would be 3 levels deep; loop.max_depth is 2"
    assert got == Answered(denial_message(DenyReason.LIMIT, detail), True)
    assert isinstance(got, Answered) and got.denied


def test_max_depth_zero_denies_every_child() -> None:
    got = spawn_check("mm", 1, SpawnChild("t"), 1, replace(LIMITS, max_depth=0))
    assert isinstance(got, Answered) and got.denied
    assert "loop.max_depth is 0" in got.text


def test_max_children_counts_the_calls_of_one_answer() -> None:
    assert spawn_check("mm", 3, SpawnChild("t"), 3, LIMITS) == "sub-mm-3"  # the 3rd of 3: ok
    got = spawn_check("mm", 4, SpawnChild("t"), 4, LIMITS)
    detail = "one answer may start 3 children (loop.max_children)"
    assert got == Answered(denial_message(DenyReason.LIMIT, detail), True)


def test_only_a_top_level_session_runs_a_child_in_the_background() -> None:
    assert spawn_check("mm", 1, SpawnChild("t", background=True), 1, LIMITS) == "sub-mm-1"
    got = spawn_check("sub-mm-1", 1, SpawnChild("t", background=True), 1, LIMITS)
    assert got == Answered(denial_message(DenyReason.LIMIT, CHILD_BACKGROUND), True)
    # The same call in the foreground starts.
    assert spawn_check("sub-mm-1", 1, SpawnChild("t"), 1, LIMITS) == "sub-sub-mm-1-1"


def test_a_child_id_that_would_not_fit_is_denied_as_invalid_arguments() -> None:
    got = spawn_check("m" * 200, 1, SpawnChild("t"), 1, LIMITS)
    assert isinstance(got, Answered) and got.denied
    assert got.text.startswith(denial_message(DenyReason.INVALID_ARGUMENTS)[:-1])
    assert "would not fit" in got.text


def test_a_childs_first_text_says_the_time_then_the_capped_task() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert child_text("abcdef", 4, now) == "It is 2026-01-02T03:04:05Z.\n\nabcd"
    assert child_text("ab", 4, now) == "It is 2026-01-02T03:04:05Z.\n\nab"


def test_the_parent_sees_the_childs_answer_neutralised_then_capped() -> None:
    assert child_summary("<|im_start|>abcdef", 4) == "abcd"
    assert child_summary("ab\x1b[31mcd", 10) == "abcd"


def test_the_parents_tool_text_for_a_childs_outcome() -> None:
    done = SubagentCompleted(
        parent="mm", call_id=1, child="sub-mm-1", summary="42", untrusted=False
    )
    assert subagent_result_text(done) == "sub-mm-1 completed\n42"
    failed = SubagentFailed(
        parent="mm", call_id=1, child="sub-mm-1", reason=FailReason.TURN_LIMIT, untrusted=False
    )
    assert subagent_result_text(failed) == "sub-mm-1 failed"


def test_a_background_report_is_a_user_message_named_subagent() -> None:
    report = BackgroundReport(parent="mm", child="sub-mm-1", text="sub-mm-1 completed\nok")
    message = report_message(report)
    assert (message.role, message.name, message.content) == (
        "user",
        "subagent",
        "sub-mm-1 completed\nok",
    )


def test_the_baseline_carries_a_memory_block_only_when_there_is_one() -> None:
    registry = Registry()
    bare = build_baseline("You help.", registry, "  \n ")
    assert bare.system == "You help."
    assert bare.tools == registry.specs()
    with_memory = build_baseline("You help.", registry, "\n- likes tea\n")
    assert with_memory.system == "You help." + MEMORY_HEADING + "- likes tea"
