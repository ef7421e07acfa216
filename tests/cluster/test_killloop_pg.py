"""SPEC's crash guarantees on PostgreSQL, proven by killing: the kill loop of
tests/killloop/killloop.py on a store shared by several processes, with its faults.

Each iteration SIGKILLs a loopd process as on SQLite and draws a fault besides: a restart of
the PostgreSQL server while the process works, a second process (a second home, the same
store) that starts and stops while the first still holds its sessions, or the settling start on
a second home. ``LOOPD_KILLLOOP_PG_ITERATIONS`` (default 20) sets the number of iterations,
``LOOPD_KILLLOOP_PG_SEED`` the loop's seed (printed either way). The test fails on any broken
guarantee, with the seed and a one-line repro.

The loop restarts its server, so it starts a server of its own, not the suite's ``pg_server``.
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from actors import Config, Runtime, SubagentsConfig, ToolContext, port_tool
from actors.core.config_tables import ApprovalsConfig, StoreConfig
from actors.stores.postgres import PgSessionStore, SessionHeldElsewhere, lock_key
from actors.testing import ScriptedModel, calls, reply
from actors.testing.postgres import PostgresServer, find_pg_bin
from actors.testing.script import Answer
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ModelRequest,
    TurnCompleted,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "killloop"))

from killloop import Postgres, report, restart_of, run

ITERATIONS = int(os.environ.get("LOOPD_KILLLOOP_PG_ITERATIONS", "20"))

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL's initdb not found")


@pytest.mark.timeout(max(600, 15 * ITERATIONS))
def test_every_guarantee_holds_after_every_kill_on_postgres(tmp_path: Path) -> None:
    seed = int(os.environ.get("LOOPD_KILLLOOP_PG_SEED") or random.randrange(1 << 30))
    started = time.monotonic()
    with PostgresServer() as server:
        url = server.create_database("loopd_killloop")
        tally = run(ITERATIONS, seed, tmp_path, postgres=Postgres(url, restart_of(server)))
    summary = report(tally, seed, time.monotonic() - started, postgres=True)
    print("\n" + summary)
    assert tally.iterations == ITERATIONS
    assert not tally.violations, summary


def test_a_second_process_cannot_decide_a_call_the_holder_waits_on(
    tmp_path: Path, pg_url: str
) -> None:
    """What the kill loop's second process found: a runtime started beside a live holder
    listed the holder's waiting call and stored a decision on it that the holder's turn never
    heard of. A start lists only the calls of families no live process runs now, so this one
    does not know the call: the decision is refused; the holder's own decision runs."""
    ran: list[int] = []

    @port_tool("deploy", "Deploy; a person must say yes first.", approval=True)
    def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(ctx.call_id)
        return "deployed"

    def start(name: str) -> Runtime:
        config = Config(home=str(tmp_path / name), store=StoreConfig(url=pg_url)).replace(
            approvals=ApprovalsConfig(tools=("deploy",))
        )
        script = [calls(("deploy", {"what": "v1"})), reply("done")]
        return Runtime.start(config, model=ScriptedModel(script), tools=[deploy])

    asked: queue.Queue[ApprovalRequested] = queue.Queue()
    with start("holder") as holder:
        holder.subscribe(lambda e: asked.put(e) if isinstance(e, ApprovalRequested) else None)
        holder.send_turn("s", "deploy it")
        request = asked.get(timeout=30)
        with start("second") as second:
            assert second.pending_approvals() == ()
            refused = second.approve("s", request.call_id, note="not mine to decide")
            assert isinstance(refused, ApprovalRefused), refused
        # A decision from outside any runtime is refused naming the holder.
        with PgSessionStore(pg_url) as outside, pytest.raises(SessionHeldElsewhere) as held:
            outside.settle_approval("s", request.call_id, True)
        assert "another loopd process holds it" in str(held.value)
        settled = holder.approve("s", request.call_id)
        assert isinstance(settled, ApprovalSettled) and settled.approved, settled
        holder.wait_family("s", timeout=30)
    assert ran == [request.call_id]


def test_a_second_start_leaves_a_live_holders_background_child_alone(
    tmp_path: Path, pg_url: str
) -> None:
    """What the kill loop's second process found: a runtime started beside a live holder read
    the holder's running background child as cut off, stored its report ``failed``, and the
    next start delivered it beside the ``completed`` one. A row of a held session is left to
    its holder now: one report, the one told."""
    go = threading.Event()

    def script(request: ModelRequest) -> Answer:
        if request.session.startswith("sub-"):
            go.wait(30)  # the child runs until the second runtime has started and settled
            return reply("child done")
        if request.messages[-1].role == "user" and request.messages[-1].name == "subagent":
            return reply("noted")
        if request.messages[-1].role == "tool":
            return reply("started it")
        return calls(("subagent", {"task": "in the background", "background": True}))

    def start(name: str) -> Runtime:
        config = Config(home=str(tmp_path / name), store=StoreConfig(url=pg_url)).replace(
            subagents=SubagentsConfig(background=True)
        )
        return Runtime.start(config, model=ScriptedModel(script))

    def reports() -> list[str]:
        with PgSessionStore(pg_url) as store:
            history = store.history("p")
        return [s.message.content or "" for s in history if s.message.name == "subagent"]

    with start("holder") as holder:
        assert isinstance(holder.run_turn("p", "go", timeout=30), TurnCompleted)
        with start("second") as second:
            # Its start read the rows and took none: nothing of p's family waits here (before,
            # the failed report it made waited for p, which the holder runs: a timeout).
            second.wait_family("p", timeout=10)
        go.set()
        holder.wait_family("p", timeout=30)
    with start("third") as third:
        third.wait_family("p", timeout=30)
    assert [r.split()[1] for r in reports()] == ["completed"], reports()


def test_a_childs_call_in_a_family_held_elsewhere_is_neither_listed_nor_decided(
    tmp_path: Path, pg_url: str
) -> None:
    """What the kill loop found with MCP approvals in children: a second runtime's start listed
    a grandchild's waiting call of a family the holder runs, and later decided it behind the
    holder's back. A start now lists only the calls of families no live process runs, and a
    decision on any member of a held family (the root's lock counts, not only the child's) is
    refused; the holder's own decision runs the call once."""
    ran: list[str] = []

    @port_tool("deploy", "Deploy; a person must say yes first.", approval=True)
    def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
        ran.append(f"{ctx.session}:{ctx.call_id}")
        return "deployed"

    def script(request: ModelRequest) -> Answer:
        last = request.messages[-1]
        if last.role == "tool":
            return reply(last.content or "")
        if request.session.startswith("sub-"):
            return calls(("deploy", {"what": "v1"}))
        return calls(("subagent", {"task": "deploy it"}))

    def start(name: str) -> Runtime:
        config = Config(home=str(tmp_path / name), store=StoreConfig(url=pg_url)).replace(
            approvals=ApprovalsConfig(tools=("deploy",))
        )
        return Runtime.start(config, model=ScriptedModel(script), tools=[deploy])

    asked: queue.Queue[ApprovalRequested] = queue.Queue()
    with start("holder") as holder:
        holder.subscribe(lambda e: asked.put(e) if isinstance(e, ApprovalRequested) else None)
        holder.send_turn("p", "ship")
        request = asked.get(timeout=30)
        assert request.session == "sub-p-1"
        with start("second") as second:
            assert second.pending_approvals() == ()  # the holder's, not this runtime's
            refused = second.approve("sub-p-1", request.call_id)
            assert isinstance(refused, ApprovalRefused), refused
        # From outside any runtime too (the CLI's way): refused while the holder runs it.
        with PgSessionStore(pg_url) as outside, pytest.raises(SessionHeldElsewhere):
            outside.settle_approval("sub-p-1", request.call_id, True)
        settled = holder.approve("sub-p-1", request.call_id)
        assert isinstance(settled, ApprovalSettled) and settled.approved, settled
        holder.wait_family("p", timeout=30)
    assert ran == [f"sub-p-1:{request.call_id}"]


def test_only_the_family_roots_lock_makes_a_child_held_elsewhere(pg_url: str) -> None:
    import psycopg

    with PgSessionStore(pg_url) as store, psycopg.connect(pg_url, autocommit=True) as other:
        with store._transaction("*", "look", write=False) as cur:
            assert not store.held_elsewhere_in(cur, "sub-sub-p-1-2")
        other.execute("SELECT pg_advisory_lock(%s)", (lock_key("p"),))
        with store._transaction("*", "look", write=False) as cur:
            assert store.held_elsewhere_in(cur, "sub-sub-p-1-2")  # p's grandchild
            assert store.held_elsewhere_in(cur, "p")
            assert not store.held_elsewhere_in(cur, "sub-q-1")  # another family
            assert not store.held_elsewhere_in(cur, "sub-pp-1")


def test_a_start_leaves_a_running_child_of_a_family_held_elsewhere_alone(pg_url: str) -> None:
    """What the kill loop's second process found next: a child's record is stored running
    before its actor opens it (and takes its lock), and a start beside the live holder took
    that child for cut off and ended it. The family's top-level lock keeps it the holder's."""
    import psycopg

    from messages.chat import Baseline, ChatMessage

    with PgSessionStore(pg_url) as store:
        for session in ("p", "sub-p-1"):
            store.create(session, Baseline(system="s"), 0)
            first = [ChatMessage(role="user", content="go")]
            store.append(session, first, turns=1, next_call_id=1, untrusted=False, running=True)
    with psycopg.connect(pg_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (lock_key("p"),))  # the live holder's
        with PgSessionStore(pg_url) as second:
            assert second.interrupted() == []  # neither p nor its child
    with PgSessionStore(pg_url) as after_the_holder:  # the holder is gone: both are cut off
        assert [r.id for r in after_the_holder.interrupted()] == ["p", "sub-p-1"]


def test_the_server_drops_a_vanished_holder_within_its_lease(pg_url: str) -> None:
    """A holder killed closes its socket and loses its locks at once; one whose machine
    vanished is dropped by the server's keepalives on its connection: loopd sets them, so the
    lease is HOLDER_LEASE_S, not the operating system's two hours."""
    from actors.stores.postgres import HOLDER_LEASE_S

    with PgSessionStore(pg_url) as store, store._transaction("*", "look", write=False) as cur:
        idle, interval, count = (
            int(cur.execute(f"SHOW tcp_keepalives_{name}").fetchone()[0])
            for name in ("idle", "interval", "count")
        )
    assert (idle, interval, count) == (10, 5, 3)
    assert idle + interval * count == HOLDER_LEASE_S
