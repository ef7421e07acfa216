"""The subagent protocol against a two-shard Ray cluster over PostgreSQL.

The wire tests of tests/test_subagent_wire.py run here unchanged (``loopd_config`` of this
folder makes the test kit start a cluster runtime); the tests below add what only a cluster
has: families on their shards, events from every shard, a restart of the whole cluster, cancel
across a process, a session another process holds.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from actors import Config, Runtime
from actors.cluster import ClusterRuntime
from actors.stores.postgres import PgSessionStore
from actors.testing import RawResponse, call, reply
from messages import (
    Baseline,
    FailReason,
    SubagentFinished,
    SubagentStarted,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_background import (
    events,
    test_a_report_reaches_the_running_parent_turn_before_its_next_request,
    test_max_background_denies_one_more,
)
from test_subagent_wire import (
    spawning_parent,
    test_a_child_whose_model_fails_answers_failed,
    test_a_second_spawn_takes_the_next_call_id,
    test_malformed_subagent_arguments_are_denied_locally,
    test_the_child_runs_fresh_on_the_background_slot_and_the_parent_prefix_holds,
    tool_texts,
    user_texts,
    wire_config,
)

from messages import Usage


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


__all__ = [
    "events",
    "test_a_child_whose_model_fails_answers_failed",
    "test_a_report_reaches_the_running_parent_turn_before_its_next_request",
    "test_a_second_spawn_takes_the_next_call_id",
    "test_malformed_subagent_arguments_are_denied_locally",
    "test_max_background_denies_one_more",
    "test_the_child_runs_fresh_on_the_background_slot_and_the_parent_prefix_holds",
]

WAIT = 60.0


def two_shards(rt: ClusterRuntime) -> tuple[str, str]:
    """Two top-level ids that live on different shards."""
    by_shard: dict[int, str] = {}
    for n in range(100):
        by_shard.setdefault(rt.shard_of(f"family-{n}"), f"family-{n}")
    return by_shard[0], by_shard[1]


def nesting(body: dict[str, Any]) -> Any:
    """Top level spawns a child, the child a grandchild; each repeats its tool text."""
    last = body["messages"][-1]
    depth = user_texts(body)[0].count("deeper")
    if last["role"] == "user" and depth < 2:
        return call("subagent", task="go deeper " * (depth + 1))
    if last["role"] == "user":
        return reply("the bottom")
    return reply(tool_texts(body)[-1])


def test_a_cluster_config_starts_a_cluster_runtime_with_its_shards(loopd_runtime):
    rt = loopd_runtime()
    assert isinstance(rt, ClusterRuntime)
    assert rt.shard_count == 2
    assert rt.shard_pid(0) != rt.shard_pid(1)


def test_a_family_nests_on_one_shard_and_its_events_stream_back(
    chat_server, loopd_runtime, loopd_config
):
    server = chat_server(nesting)
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    events: list[TurnEvent] = []
    ended = threading.Event()

    def seen(event: TurnEvent) -> None:
        events.append(event)
        if isinstance(event, TurnEnded) and event.session == "mm-thread":
            ended.set()

    rt.subscribe(seen)
    outcome = rt.run_turn("mm-thread", "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        "mm-thread",
        "sub-mm-thread-1 completed\nsub-sub-mm-thread-1-1 completed\nthe bottom",
        usage=unmeasured(5),
    )
    assert [body["id_slot"] for body in server.requests] == [0, 1, 1, 1, 0]
    assert ended.wait(WAIT)
    started = [(e.session, e.child) for e in events if isinstance(e, SubagentStarted)]
    assert started == [
        ("mm-thread", "sub-mm-thread-1"),
        ("sub-mm-thread-1", "sub-sub-mm-thread-1-1"),
    ]
    finished = [e.child for e in events if isinstance(e, SubagentFinished) and e.completed]
    assert finished == ["sub-sub-mm-thread-1-1", "sub-mm-thread-1"]
    assert rt.shard_of("sub-sub-mm-thread-1-1") == rt.shard_of("mm-thread")


def test_families_on_two_shards_run_at_once(chat_server, loopd_runtime, loopd_config):
    asked = threading.Barrier(2, timeout=WAIT)

    def script(body: dict[str, Any]) -> Any:
        # Each family's first request waits for the other's: only concurrent turns pass.
        if len(body["messages"]) == 2:
            asked.wait()
        return reply(f"hello {user_texts(body)[0]}")

    server = chat_server(script)
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    first, second = two_shards(rt)
    answers: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answers.update(a=rt.run_turn(first, "a", WAIT)))
    thread.start()
    answers["b"] = rt.run_turn(second, "b", WAIT)
    thread.join(WAIT)
    assert answers == {
        "a": TurnCompleted(first, "hello a", usage=unmeasured(1)),
        "b": TurnCompleted(second, "hello b", usage=unmeasured(1)),
    }


def test_a_restarted_cluster_goes_on_with_the_stored_sessions_and_call_ids(
    chat_server, loopd_runtime, loopd_config
):
    server = chat_server(spawning_parent(lambda body: reply("done")))
    config = wire_config(loopd_config, server.base_url)
    first = loopd_runtime(config=config)
    assert first.run_turn("mm-thread", "one", timeout=WAIT) == TurnCompleted(
        "mm-thread", "sub-mm-thread-1 completed\ndone", usage=unmeasured(3)
    )
    first.stop()
    second = loopd_runtime(config=config)
    assert second.run_turn("mm-thread", "two", timeout=WAIT) == TurnCompleted(
        "mm-thread", "sub-mm-thread-2 completed\ndone", usage=unmeasured(3)
    )
    last = server.requests[-1]
    assert user_texts(last)[:2] == ["one", "two"] and len(tool_texts(last)) == 2


def test_cancel_reaches_the_family_on_its_shard(chat_server, loopd_runtime, loopd_config):
    child_asked, release = threading.Event(), threading.Event()

    def child(body: dict[str, Any]) -> Any:
        child_asked.set()
        release.wait(WAIT)
        return reply("too late")

    server = chat_server(spawning_parent(child))
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    answers: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answers.update(a=rt.run_turn("mm-thread", "go", WAIT)))
    thread.start()
    try:
        assert child_asked.wait(WAIT)
        assert set(rt.cancel("mm-thread")) == {"mm-thread", "sub-mm-thread-1"}
        thread.join(WAIT)
    finally:
        release.set()
    outcome = answers["a"]
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.CANCELLED
    assert rt.cancel("mm-thread") == ()


def test_send_turn_answers_its_reply_address(chat_server, loopd_runtime, loopd_config):
    server = chat_server([reply("sent")])
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    got: list[Any] = []
    done = threading.Event()

    class Mailbox:
        def tell(self, message: Any) -> None:
            got.append(message)
            done.set()

    rt.directory.register("mailbox", Mailbox())
    rt.send_turn("s", "hello", reply_to="mailbox")
    assert done.wait(WAIT)
    assert got == [TurnCompleted("s", "sent", usage=unmeasured(1))]


def test_a_session_another_process_holds_is_busy_until_it_lets_go(
    chat_server, loopd_runtime, loopd_config, pg_url
):
    server = chat_server([reply("mine now")])
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    with PgSessionStore(pg_url) as other:  # another process, as far as PostgreSQL can tell
        other.open_or_create("taken", Baseline(system="theirs"), 0)
        busy = rt.run_turn("taken", "hi", timeout=WAIT)
        assert isinstance(busy, TurnFailed) and busy.reason is FailReason.BUSY
        assert "another loopd process holds it" in busy.detail
        other.release("taken")
        assert rt.run_turn("taken", "hi", timeout=WAIT) == TurnCompleted(
            "taken", "mine now", usage=unmeasured(1)
        )
        (result,) = other.run_batch([("taken", lambda cur: other.open_in(cur, "taken"))])
        assert isinstance(result, Exception) and "another loopd process" in str(result)


def test_a_bad_model_answer_fails_the_turn_and_loses_nothing(
    chat_server, loopd_runtime, loopd_config, pg_url
):
    answers = [reply("first answer"), RawResponse(503, b"overloaded"), reply("third answer")]
    server = chat_server(answers)
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    assert isinstance(rt.run_turn("s", "one", timeout=WAIT), TurnCompleted)
    failed = rt.run_turn("s", "two", timeout=WAIT)
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.MODEL_ERROR
    assert rt.run_turn("s", "three", timeout=WAIT) == TurnCompleted(
        "s", "third answer", usage=unmeasured(1)
    )
    rt.stop()
    with PgSessionStore(pg_url) as store:
        texts = [m.content for m in store.open("s").transcript]
    assert texts == ["one", "first answer", "two", "three", "third answer"]


def test_a_cluster_refuses_in_process_parts(loopd_config: Config):
    from actors.testing import ScriptedModel

    with pytest.raises(ValueError, match="model=, memory= and clock= are for one process"):
        Runtime.start(loopd_config, model=ScriptedModel([reply("x")]))


def test_a_child_id_that_would_not_fit_is_denied_on_the_shard(
    chat_server, loopd_runtime, loopd_config, pg_url
):
    parent = "a" * 59
    server = chat_server(spawning_parent(lambda body: reply("never")))
    rt = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    outcome = rt.run_turn(parent, "go", timeout=WAIT)
    assert outcome == TurnCompleted(
        parent,
        "Denied: the arguments are not valid for this tool: "
        f"child session id `sub-{parent}-1` would not fit; see docs/runbook.md#subagent-id.",
        usage=unmeasured(2),
    )
    assert [body["id_slot"] for body in server.requests] == [0, 0]
    with PgSessionStore(pg_url) as store:
        assert [info.id for info in store.list_sessions()] == [parent]  # no child was stored


REFUSED: list[tuple[str, Any, dict[str, Any]]] = [
    # (session, text, keyword arguments) of calls Runtime refuses before anything is sent.
    ("sub-s-1", "hi", {}),  # a child's id
    ("no spaces", "hi", {}),
    ("s", b"bytes", {}),
    ("s", "\ud800", {}),  # not valid Unicode
    ("s", "hi", {"speaker": 3}),
    ("s", "hi", {"agent": "nobody"}),
    ("s", "hi", {"timeout": -1}),
    ("s", "hi", {"timeout": 0}),
    ("s", "hi", {"timeout": float("nan")}),
    ("s", "hi", {"timeout": float("inf")}),
    ("s", "hi", {"timeout": "5"}),
]


def refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[type[BaseException], str]:
    with pytest.raises((TypeError, ValueError, RuntimeError)) as refused:
        call(*args, **kwargs)
    return type(refused.value), str(refused.value)


def test_the_cluster_refuses_what_runtime_refuses_before_a_shard_is_called(
    chat_server, loopd_runtime, loopd_config, tmp_path, pg_url
):
    from actors.testing import ScriptedModel

    server = chat_server([reply("ok")])
    cluster = loopd_runtime(config=wire_config(loopd_config, server.base_url))
    shardless = ClusterRuntime(loopd_config, [], owns_ray=False)  # any call to a shard fails
    local = Runtime.start(Config(home=str(tmp_path / "local")), model=ScriptedModel([]))
    try:
        for session, text, options in REFUSED:
            expected = refusal(local.run_turn, session, text, **options)
            assert refusal(cluster.run_turn, session, text, **options) == expected
            assert refusal(shardless.run_turn, session, text, **options) == expected
            if "timeout" in options:
                continue
            expected = refusal(local.send_turn, session, text, **options)
            assert refusal(cluster.send_turn, session, text, **options) == expected
            assert refusal(shardless.send_turn, session, text, **options) == expected
        for session, timeout in (("no spaces", 1.0), ("s", -1), ("s", float("nan"))):
            expected = refusal(local.cancel, session, timeout)
            assert refusal(cluster.cancel, session, timeout) == expected
        shardless._stopped = True  # as after stop(), which a runtime without shards cannot do
        local.stop()
        stopped = refusal(local.run_turn, "s", "hi")
        assert refusal(shardless.run_turn, "s", "hi") == stopped
        assert refusal(shardless.send_turn, "s", "hi") == stopped
        assert refusal(shardless.cancel, "s") == stopped
    finally:
        local.stop()
    outcome = cluster.run_turn("s", "hi", timeout=WAIT)  # the cluster still works
    assert isinstance(outcome, TurnCompleted) and outcome.content == "ok"
    assert len(server.requests) == 1  # that turn's: no refused call reached a model
    with PgSessionStore(pg_url) as store:
        assert [info.id for info in store.list_sessions()] == ["s"]
