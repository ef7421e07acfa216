"""Faults of a cluster: a shard's process killed mid-turn, the PostgreSQL server stopped."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest

from actors import Config, ModelConfig, Runtime
from actors.core.config import ClusterConfig, StoreConfig
from actors.runtime.interrupted import CRASHED_DETAIL
from actors.stores.postgres import PgSessionStore
from actors.testing import call, reply
from actors.testing.postgres import PostgresServer
from messages import FailReason, TurnCompleted, TurnEnded, TurnFailed, Usage
from messages.chat import Baseline, ChatMessage


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 60.0
CRASH_ANSWER_S = 10.0
"""What "within a few seconds" means here: generous for a loaded 2-core CI machine."""


def test_a_shard_killed_with_a_child_in_flight_fails_the_turn_and_the_next_repairs_it(
    chat_server, loopd_runtime, loopd_config, pg_url
):
    child_asked, release = threading.Event(), threading.Event()

    def script(body: dict[str, Any]) -> Any:
        if body["id_slot"] == 1:
            child_asked.set()
            release.wait(WAIT)  # the first child never answers before the kill
            return reply("child done")
        if body["messages"][-1]["role"] == "user":
            return call("subagent", task="slow work")
        return reply(body["messages"][-1]["content"])

    server = chat_server(script)
    model = ModelConfig(base_url=server.base_url, name="local", timeout_s=WAIT, retries=0)
    rt = loopd_runtime(config=loopd_config.replace(model=model))
    ended: queue.Queue[TurnEnded] = queue.Queue()
    told: list[bytes] = []
    rt.subscribe(lambda e: ended.put(e) if isinstance(e, TurnEnded) else None)
    rt.subscribe(lambda e: told.append(msgspec.msgpack.encode(e)))
    shard = rt.shard_of("mm-thread")
    pid = rt.shard_pid(shard)
    answers: dict[str, Any] = {}
    turn = threading.Thread(target=lambda: answers.update(a=rt.run_turn("mm-thread", "go", WAIT)))
    turn.start()
    try:
        assert child_asked.wait(WAIT)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        turn.join(CRASH_ANSWER_S)
        answered_in = time.monotonic() - killed
    finally:
        release.set()
    assert not turn.is_alive(), "run_turn did not answer after its shard was killed"
    outcome = answers["a"]
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.CRASHED
    assert f"shard {shard} died" in outcome.detail
    assert answered_in < CRASH_ANSWER_S

    # Ray starts the shard again, and its start ends the turn the kill cut off and tells the
    # driver's subscribers so. (The child had asked its model and stored nothing yet: it was
    # never told started, and there is nothing of it to end.)
    assert rt.shard_pid(shard, timeout=WAIT) != pid
    event = ended.get(timeout=WAIT)
    assert (event.session, event.completed, event.reason, event.detail) == (
        "mm-thread",
        False,
        FailReason.CRASHED,
        CRASHED_DETAIL,
    )
    # The next turn finds every committed message: the cut-off call of the first turn was
    # answered `<child> failed` by that start.
    again = rt.run_turn("mm-thread", "again", timeout=WAIT)
    assert again == TurnCompleted(
        "mm-thread", "sub-mm-thread-2 completed\nchild done", usage=unmeasured(3)
    )
    with PgSessionStore(pg_url) as store:
        history = [h.message for h in store.history("mm-thread")]
    assert [(m.role, m.content) for m in history[:3]] == [
        ("user", "go"),
        ("assistant", None),
        ("tool", "sub-mm-thread-1 failed"),
    ]
    assert [c.id for c in history[1].tool_calls] == [1]
    assert history[2].tool_call_id == 1
    assert history[3].content == "again"
    # The repaired turn is what the model saw on the next request, prefix and all.
    last = server.requests[-1]
    tool_texts = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert tool_texts == ["sub-mm-thread-1 failed", "sub-mm-thread-2 completed\nchild done"]
    # Across the restart, the shard's outbox handed each event over once.
    rt.stop()
    assert len(told) == len(set(told)) > 0


def test_a_cluster_start_tells_its_subscribers_the_turns_a_crash_cut_off(
    loopd_runtime, loopd_config, pg_url
):
    # A store as a killed process leaves it: a turn stored running, its call never answered.
    with PgSessionStore(pg_url) as store:
        store.create("cut", Baseline(system="You are careful."), 0)
        store.append(
            "cut",
            [ChatMessage(role="user", content="go")],
            turns=1,
            next_call_id=1,
            untrusted=False,
            running=True,
        )
    told: list[object] = []
    rt = loopd_runtime(config=loopd_config, subscribe=[told.append])
    # Told before Runtime.start returned, by the shard that hosts the family.
    assert [(e.session, e.completed, e.reason, e.detail) for e in told] == [
        ("cut", False, FailReason.CRASHED, CRASHED_DETAIL)
    ]
    with PgSessionStore(pg_url) as store:
        assert store.interrupted() == []
    assert rt.shard_count == 2
    rt.stop()  # every event was handed over and acknowledged: the outbox is empty
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM loopd_outbox").fetchone() == (0,)


@pytest.mark.parametrize("engine", ["none", "ray"])
def test_a_stopped_postgres_fails_turns_with_store_error_and_they_work_again(
    request, chat_server, tmp_path: Path, engine: str
) -> None:
    if engine == "ray":
        request.getfixturevalue("ray_local")
    with PostgresServer() as pg:  # its own server: this test stops it
        url = pg.create_database("loopd_down")
        server = chat_server([reply("first"), reply("third")])
        config = Config(
            home=str(tmp_path / "home"),
            model=ModelConfig(base_url=server.base_url, name="local", timeout_s=WAIT, retries=0),
            store=StoreConfig(url=url, connect_timeout_s=2.0),
            cluster=ClusterConfig(engine=engine, shards=2, max_restarts=2),
        )
        rt = Runtime.start(config)
        try:
            assert rt.run_turn("s", "one", timeout=WAIT) == TurnCompleted(
                "s", "first", usage=unmeasured(1)
            )
            pg.stop()
            failed = rt.run_turn("s", "two", timeout=WAIT)
            assert isinstance(failed, TurnFailed) and failed.reason is FailReason.STORE_ERROR
            assert "PostgreSQL" in failed.detail or "connection" in failed.detail
            assert len(server.requests) == 1  # nothing unstored was sent to the model
            pg.start()
            assert rt.run_turn("s", "three", timeout=WAIT) == TurnCompleted(
                "s", "third", usage=unmeasured(1)
            )
        finally:
            rt.stop()
        with PgSessionStore(url) as store:
            texts = [m.content for m in store.open("s").transcript]
    assert texts == ["one", "first", "three", "third"]
