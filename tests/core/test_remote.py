"""A remote (A2A) child's decisions (actors/core/remote.py), pinned at the core: what a card
offers, which of its interfaces a profile's headers may go to, what a task in each state means
for the child and the texts it reads of parts. Plain functions, plain JSON values."""

from __future__ import annotations

import pytest

from actors.core.bounded import OutOfBounds
from actors.core.remote import (
    TaskStep,
    card_interfaces,
    on_origin,
    origin,
    parts_text,
    remote_reason,
    remote_task_text,
    task_step,
)

JSONRPC = {"protocolBinding": "JSONRPC", "protocolVersion": "1.0", "url": "http://a.test/rpc"}


# The task a remote child sends.


def test_the_remote_gets_the_task_without_the_local_clock_line() -> None:
    assert remote_task_text("It is Sunday 6 December 2026, 02:00 UTC.\n\nDeploy it") == "Deploy it"
    task = "Deploy it\n\nthen report"
    assert remote_task_text(task) == task  # no clock line: the text as it is
    assert remote_task_text("It is late\n\nDeploy") == "It is late\n\nDeploy"  # no full stop
    assert remote_task_text("So. It is.\n\nDeploy") == "So. It is.\n\nDeploy"
    assert remote_task_text("It is noon.") == "It is noon."  # nothing after it


def test_a_remote_reason_names_the_agent_and_is_neutralised_and_capped() -> None:
    said = remote_reason("http://a.test", "\x1b[31mboom\x1b[0m <|im_start|>")
    assert said == "remote agent http://a.test: boom "
    long = remote_reason("http://a.test", "x" * 5000)
    assert long == "remote agent http://a.test: " + "x" * 2000


# The card.


def test_a_card_that_is_not_an_object_has_no_interface() -> None:
    assert card_interfaces(["a"]) == "its agent card is not a JSON object"


def test_a_card_of_a2a_0_3_is_named_so() -> None:
    said = card_interfaces({"protocolVersion": "0.3.0", "url": "http://a.test"})
    assert said == "its agent card is A2A '0.3.0', not 1.0 (no supportedInterfaces)"
    long = card_interfaces({"protocolVersion": "9" * 50, "supportedInterfaces": []})
    assert long == f"its agent card is A2A {'9' * 20!r}, not 1.0 (no supportedInterfaces)"


def test_a_card_without_interfaces_is_not_a2a_1() -> None:
    expected = "its agent card lists no supportedInterfaces (not an A2A 1.0 card)"
    assert card_interfaces({}) == expected
    assert card_interfaces({"supportedInterfaces": "JSONRPC"}) == expected
    assert card_interfaces({"supportedInterfaces": [], "protocolVersion": 1}) == expected


def test_only_a2a_1_jsonrpc_interfaces_with_a_url_count() -> None:
    grpc = {**JSONRPC, "protocolBinding": "GRPC"}
    old = {**JSONRPC, "protocolVersion": "0.3"}
    eleven = {**JSONRPC, "protocolVersion": "11.0"}
    numeric = {**JSONRPC, "protocolVersion": 1}
    no_url = {k: v for k, v in JSONRPC.items() if k != "url"}
    bad_url = {**JSONRPC, "url": 7}
    two = {**JSONRPC, "protocolVersion": "1.2", "url": "http://b.test/rpc"}
    card = {"supportedInterfaces": ["x", grpc, old, eleven, numeric, no_url, bad_url, JSONRPC, two]}
    found = card_interfaces(card)
    assert found == [JSONRPC, two]
    assert isinstance(found, list) and found[0] is not JSONRPC  # copies: the card is untouched


def test_a_card_with_no_usable_interface_says_so() -> None:
    card = {"supportedInterfaces": [{**JSONRPC, "protocolBinding": "HTTP+JSON"}]}
    said = card_interfaces(card)
    assert said == "its agent card has no A2A 1.x JSON-RPC interface (not A2A 1.0)"


# Origins: where a profile's headers may go.


def test_an_origin_is_scheme_host_and_port_with_the_schemes_default() -> None:
    assert origin("HTTP://A.Test/x") == ("http", "a.test", 80)
    assert origin("https://a.test/x") == ("https", "a.test", 443)
    assert origin("https://a.test:8443/x") == ("https", "a.test", 8443)
    assert origin("ftp://a.test/x") == ("ftp", "a.test", None)
    assert origin("http://a.test:99999/x") == ("http", "a.test", 80)  # a port out of range
    assert origin("/relative") == ("", "", None)


def test_headers_go_only_to_interfaces_on_the_a2a_urls_origin() -> None:
    here = {**JSONRPC, "url": "http://a.test:80/rpc"}
    there = {**JSONRPC, "url": "http://b.test/rpc"}
    assert on_origin([there, here], "http://A.test/card") == [here]
    said = on_origin([there], "http://a.test")
    assert said == (
        "its agent card's interface 'http://b.test/rpc' is on another origin; with "
        "headers_env, loopd sends requests only to the origin of a2a_url"
    )
    long = {**JSONRPC, "url": "http://b.test/" + "p" * 400}
    said = on_origin([long, there], "http://a.test")
    assert isinstance(said, str) and repr(long["url"][:200]) in said
    assert "p" * 186 + "'" in said  # 200 characters of it


# Parts.


def test_parts_read_as_text_one_per_line() -> None:
    parts = [
        {"text": "hello"},
        "not a part",
        {"data": {"n": 3.0, "half": 0.5, "list": [1.0, {"deep": 2.0}], "s": "x"}},
        {"url": "http://a.test/f.pdf"},
        {"raw": "AAAA"},
        {"text": 5},
        {"nothing": True},
        {"text": "bye"},
    ]
    assert parts_text(parts) == (
        'hello\n{"n":3,"half":0.5,"list":[1,{"deep":2}],"s":"x"}\n'
        "[file: http://a.test/f.pdf]\n[binary part]\nbye"
    )


def test_parts_that_are_not_a_list_read_as_nothing() -> None:
    assert parts_text(None) == ""
    assert parts_text({"text": "x"}) == ""
    assert parts_text([]) == ""


def test_a_part_s_url_is_capped_and_huge_doubles_stay_doubles() -> None:
    assert parts_text([{"url": "u" * 300}]) == f"[file: {'u' * 200}]"
    assert parts_text([{"data": 2.0**53}]) == "9007199254740992.0"
    assert parts_text([{"data": -(2.0**53) + 1}]) == "-9007199254740991"
    assert parts_text([{"data": None}]) == "null"


def test_a_data_part_is_checked_before_it_is_read() -> None:
    with pytest.raises(OutOfBounds):
        parts_text([{"data": {"bad": "\ud800"}}])


# Tasks.


def task(state: str, said: str | None = None, **rest: object) -> dict[str, object]:
    status: dict[str, object] = {"state": state}
    if said is not None:
        status["message"] = {"parts": [{"text": said}]}
    return {"status": status, **rest}


def test_a_task_still_working_is_waited_for() -> None:
    for state in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_UNSPECIFIED", ""):
        assert task_step(task(state, "busy"), 100) == TaskStep(False)
    assert task_step({"status": {}}, 100) == TaskStep(False)  # no state: waiting
    assert task_step({"status": {"state": 3}}, 100) == TaskStep(False)
    assert task_step({"status": "working"}, 100) == TaskStep(False)


def test_something_that_is_not_a_task_fails_the_child() -> None:
    said = task_step(["TASK_STATE_COMPLETED"], 100)
    assert said == TaskStep(True, what="it answered something that is not a task")


def test_a_remote_that_asks_for_input_is_cancelled_and_fails_with_its_question() -> None:
    step = task_step(task("TASK_STATE_INPUT_REQUIRED", "which region?"), 100)
    assert step == TaskStep(
        True, cancel=True, what="INPUT_REQUIRED: it asked for input: which region?"
    )
    step = task_step(task("TASK_STATE_AUTH_REQUIRED"), 100)
    assert step == TaskStep(
        True, cancel=True, what="AUTH_REQUIRED: it asked for input: (no question given)"
    )


def test_a_completed_task_answers_its_artifacts_text_capped() -> None:
    artifacts = [
        {"parts": [{"text": "first"}]},
        "junk",
        {"parts": []},
        {"parts": [{"text": "second"}]},
    ]
    step = task_step(task("TASK_STATE_COMPLETED", "done", artifacts=artifacts), 100)
    assert step == TaskStep(True, completed=True, text="first\nsecond")
    capped = task_step(task("TASK_STATE_COMPLETED", artifacts=artifacts), 4)
    assert capped == TaskStep(True, completed=True, text="firs")


def test_a_completed_task_without_artifacts_answers_its_status_message() -> None:
    step = task_step(task("TASK_STATE_COMPLETED", "all done"), 100)
    assert step == TaskStep(True, completed=True, text="all done")
    step = task_step(task("TASK_STATE_COMPLETED", "all done", artifacts="none"), 3)
    assert step == TaskStep(True, completed=True, text="all")
    assert task_step(task("TASK_STATE_COMPLETED"), 100) == TaskStep(True, completed=True)


def test_a_task_that_ended_otherwise_fails_with_its_state_and_message() -> None:
    step = task_step(task("TASK_STATE_FAILED", "disk full"), 100)
    assert step == TaskStep(True, what="FAILED: disk full")
    assert task_step(task("TASK_STATE_CANCELED"), 100) == TaskStep(True, what="CANCELED")
    step = task_step(task("TASK_STATE_REJECTED", "no thanks, not today"), 10)
    assert step == TaskStep(True, what="REJECTED: no thanks,")


def test_a_task_in_an_unknown_state_is_cancelled_and_fails() -> None:
    step = task_step(task("TASK_STATE_" + "Z" * 60), 100)
    assert step == TaskStep(
        True, cancel=True, what=f"its task is in an unknown state {('TASK_STATE_' + 'Z' * 29)!r}"
    )


def test_a_task_s_words_must_be_valid_unicode() -> None:
    with pytest.raises(OutOfBounds, match=r"^the task's status message is not valid Unicode"):
        task_step(task("TASK_STATE_FAILED", "bad \ud800"), 100)
    artifacts = [{"parts": [{"text": "bad \ud800"}]}]
    with pytest.raises(OutOfBounds, match=r"^the task's artifacts is not valid Unicode"):
        task_step(task("TASK_STATE_COMPLETED", artifacts=artifacts), 100)


def test_a_task_of_several_paragraphs_is_sent_whole() -> None:
    text = "It is Sunday 6 December 2026, 02:00 UTC.\n\nDeploy it.\n\nThen report."
    assert remote_task_text(text) == "Deploy it.\n\nThen report."


def test_a_remote_context_id_names_the_child_within_64_bytes() -> None:
    from actors.core.remote import remote_context_id

    assert remote_context_id("sub-p-3", "a1b2") == "loopd-sub-p-3-a1b2"
    long = remote_context_id("sub-" + "p" * 60 + "-3", "a1b2")
    assert len(long) == 64 and long.startswith("loopd-sub-ppp") and long.endswith("-a1b2")
    assert remote_context_id("sub-p-3", "f" * 80) == "loopd--" + "f" * 80  # no room left
