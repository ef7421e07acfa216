"""The process the kill loop kills: a seeded random workload on one home, journalling all
it is told.

    python killloop_driver.py work   HOME JOURNAL EFFECTS SEED [MAX_SECONDS]
    python killloop_driver.py settle HOME JOURNAL EFFECTS SEED [MAX_SECONDS]
    python killloop_driver.py probe  HOME JOURNAL EFFECTS SEED [MAX_SECONDS]

``work`` runs turns on a few top-level sessions, back to back, with a scripted model drawn from a
generator seeded with SEED: plain answers, parallel calls of a side-effecting port tool
(``effect``), a call that waits for a person (``deploy``, decided by a decider thread after a
random moment, sometimes approved, sometimes declined), the same two as MCP tools of a stdio
server (``fx__effect``, ``fx__deploy``: effects_mcp.py, which the runtime starts and ends),
children and grandchildren, background children, a typed session that answers through
``final_answer``, and compaction. ``settle``
starts on the same home and does no new work: it decides what still waits for a person, waits
until every family is idle and every background report is delivered, then stops cleanly.
``probe`` is a second process on a shared store while a ``work`` run still holds its sessions:
it starts, asks each top-level session for a turn and tries to decide every waiting call once,
journals what it is told (a live holder's sessions must answer ``busy``), and stops.

The store is the SQLite file of HOME, or the PostgreSQL database of ``LOOPD_KILLLOOP_STORE_URL``
when that is set (then several homes may share it: the home keeps only its lock).

Everything the process is told is written to JOURNAL (one JSON line, ``os.write`` on an
``O_APPEND`` file, then ``fdatasync``) *before* anything acts on it: every turn event a
subscriber gets, every outcome a caller gets, every decision ``approve``/``deny`` returns. Then
the line's kind is printed to stdout, so the harness can kill right after a chosen event. The
side-effecting tools write to EFFECTS before they return: a port tool's line names the
session and call id, an MCP tool's the ``key`` the model passed (unique to the call; the server
knows neither). A SIGKILL can come at any instant.

This is a helper script, not a test module. It stops by itself after MAX_SECONDS (default 60).
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from actors import (
    CompactConfig,
    Config,
    Runtime,
    SubagentsConfig,
    ToolContext,
    port_tool,
)
from actors.core.config_tables import ApprovalsConfig, LoopConfig, StoreConfig
from actors.core.mcp_config import McpServerConfig
from actors.core.turn import COMPACT_INSTRUCTION
from actors.stores.sqlite import SessionStore
from actors.testing import ScriptedModel, calls, reply
from actors.testing.script import Answer, with_usage
from messages import (
    ApprovalRequested,
    ModelRequest,
    TurnCompleted,
    TurnEvent,
)

SESSIONS = ("kl-a", "kl-b")
"""The plain top-level sessions; the same on every start."""

TYPED = "kl-typed"
"""The typed top-level session: it ends its turns by calling final_answer."""

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}

OUTCOMES = "killloop-outcomes"
THINK_S = 0.01
MAX_STEPS = 3
STALL_S = 30.0
PROBE_S = 3.0
"""How long a probe waits for the answers of its turns and decisions."""
STORE_URL_ENV = "LOOPD_KILLLOOP_STORE_URL"
MCP_SERVER = Path(__file__).resolve().parent / "effects_mcp.py"
"""The MCP server ``fx``: ``fx__effect`` and ``fx__deploy`` (which waits for a person)."""


class Journal:
    """An append-only file of everything told, written and synced before anyone acts on it."""

    def __init__(self, path: str, run: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._run = run
        self._lock = threading.Lock()
        self._encode = msgspec.json.Encoder().encode

    def write(self, kind: str, body: dict[str, Any]) -> None:
        line = self._encode({"run": self._run, "kind": kind, **body}) + b"\n"
        with self._lock:
            os.write(self._fd, line)
            os.fdatasync(self._fd)
            # The harness may kill right after this line: print it only once it is durable.
            sys.stdout.write(f"{kind} {body.get('tag', '')}\n")
            sys.stdout.flush()

    def event(self, event: TurnEvent) -> None:
        body = msgspec.to_builtins(event)
        self.write("event", {"tag": type(event).__name__, "event": body})


class Effects:
    """The side-effect log: one line per tool run, written before the tool returns."""

    def __init__(self, path: str, run: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._run = run

    def record(self, tool: str, ctx: ToolContext) -> str:
        line = msgspec.json.encode(
            {"run": self._run, "tool": tool, "session": ctx.session, "call_id": ctx.call_id}
        )
        os.write(self._fd, line + b"\n")
        os.fdatasync(self._fd)
        return f"{tool} done for {ctx.session} call {ctx.call_id}"


def tools(effects: Effects) -> list[Any]:
    @port_tool("effect", "Change something in the world, once.")
    def effect(args: dict[str, Any], ctx: ToolContext) -> str:
        return effects.record("effect", ctx)

    @port_tool("deploy", "Deploy; a person must say yes first.", approval=True)
    def deploy(args: dict[str, Any], ctx: ToolContext) -> str:
        return effects.record("deploy", ctx)

    return [effect, deploy]


def steps_this_turn(request: ModelRequest) -> int:
    steps = 0
    for message in reversed(request.messages):
        if message.role == "user":
            break
        if message.role == "assistant" and message.tool_calls:
            steps += 1
    return steps


def make_script(rng: random.Random, settle: bool):
    """The model: a function of each request, drawing its choices from ``rng``. About half of
    the side-effecting calls go to the MCP server instead of the port (each with a key unique
    to the call: the session, the answer's 40-bit token and the call's place in the answer)."""
    lock = threading.Lock()

    def script(request: ModelRequest) -> Answer:
        # Every answer reports its tokens, different from answer to answer, so the checker
        # can tell that the usage told with an answer is the usage stored with it.
        prompt = sum(len(m.content or "") for m in request.messages) // 4 + 1
        return with_usage(answer(request), prompt, 1 + len(request.messages) % 17)

    def answer(request: ModelRequest) -> Answer:
        with lock:
            roll, token, n = rng.random(), rng.getrandbits(40), rng.randint(1, 3)
            mix = rng.getrandbits(4)  # bit i: the answer's i-th side effect goes to MCP
            think = rng.uniform(0, THINK_S)
        time.sleep(think)  # the model's think time, inside the process that gets killed
        session = request.session
        last = request.messages[-1]

        def effect(i: int) -> tuple[str, dict[str, Any]]:
            if mix >> i & 1:
                return ("fx__effect", {"key": f"{session}:{token:010x}:{i}"})
            return ("effect", {"i": i})

        def deploy(i: int) -> tuple[str, dict[str, Any]]:
            what = f"v{token % 100}"
            if mix >> i & 1:
                return ("fx__deploy", {"key": f"{session}:{token:010x}:{i}", "what": what})
            return ("deploy", {"what": what})

        if last.role == "user" and last.content == COMPACT_INSTRUCTION:
            return reply(f"{session} so far: turns, calls and children.")
        typed = session == TYPED
        done = steps_this_turn(request) >= MAX_STEPS or settle
        if typed:
            if done or roll < 0.5:
                return calls(("final_answer", {"n": token}))
            return calls(*[effect(i) for i in range(n)])
        level = session.count("sub-")
        if done or (last.role == "tool" and roll < 0.5):
            return reply(f"{session} answer {token:010x}")
        if level == 0:
            if roll < 0.15:
                return reply(f"{session} answer {token:010x}")
            if roll < 0.40:
                return calls(*[effect(i) for i in range(n)])
            if roll < 0.55:
                return calls(deploy(0), effect(1))
            if roll < 0.75:
                return calls(*[("subagent", {"task": f"part {i}"}) for i in range(n)])
            if roll < 0.90:
                return calls(("subagent", {"task": "in the background", "background": True}))
            return calls(effect(0), ("subagent", {"task": "one part"}))
        if level == 1 and roll < 0.2:
            return calls(("subagent", {"task": "a smaller part"}))
        if roll < 0.45:
            return calls(effect(0))
        if roll < 0.5:
            return calls(("fx__deploy", {"key": f"{session}:{token:010x}:0", "what": "part"}))
        return reply(f"{session} done {token:010x}")

    return script


class Outcomes:
    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

    def tell(self, message: Any) -> None:
        self.queue.put(message)


def decider(
    rt: Runtime,
    journal: Journal,
    rng: random.Random,
    requests: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    """A person: decides each waiting call after a random moment, journalling what it is told."""
    while not stop.is_set():
        try:
            request: ApprovalRequested = requests.get(timeout=0.2)
        except queue.Empty:
            continue
        stop.wait(rng.uniform(0, 0.05))
        approve = rng.random() < 0.7
        try:
            if approve:
                answer = rt.approve(request.session, request.call_id, note="fine")
            else:
                answer = rt.deny(request.session, request.call_id, "not now")
        except Exception as exc:  # a stopped runtime: nothing was told
            print(f"decider: {exc!r}", file=sys.stderr)
            continue
        journal.write(
            "decision",
            {
                "tag": type(answer).__name__,
                "decision": msgspec.to_builtins(answer),
                "approved": approve,
            },
        )


def running_in_store(home: str, url: str | None) -> list[str]:
    """The sessions the store marks running, whoever holds them (read before the start)."""
    if url is not None:
        import psycopg

        from actors.stores.postgres import PgSessionStore

        # Not store.interrupted(): that leaves out what a live process holds, and takes locks.
        with psycopg.connect(url, connect_timeout=10) as conn:
            try:
                rows = conn.execute(PgSessionStore.dialect.q.interrupted).fetchall()
            except psycopg.errors.UndefinedTable:  # a new database: the start creates them
                return []
        return sorted(row[0] for row in rows)
    db = Path(home) / "loopd.db"
    if not db.exists():
        return []
    with SessionStore(db) as store:
        return sorted(record.id for record in store.interrupted())


def probe(rt: Runtime, journal: Journal, outcomes: Outcomes) -> None:
    """Ask each top-level session for a turn and decide each waiting call once, journalling
    every answer: a session a live process holds answers busy, a decision is refused."""
    for session in (*SESSIONS, TYPED):
        output = SCHEMA if session == TYPED else None
        rt.send_turn(session, "a second process asks", reply_to=OUTCOMES, output=output)
    for pending in rt.pending_approvals():
        try:
            answer = rt.approve(pending.session, pending.call_id, note="from a second process")
        except Exception as exc:
            journal.write("refused", {"tag": type(exc).__name__, "detail": str(exc)[:200]})
            continue
        journal.write(
            "decision",
            {
                "tag": type(answer).__name__,
                "decision": msgspec.to_builtins(answer),
                "approved": True,
            },
        )
    for _ in range(3):
        try:
            outcome = outcomes.queue.get(timeout=PROBE_S)
        except queue.Empty:
            break
        journal.write(
            "outcome",
            {
                "tag": type(outcome).__name__,
                "session": outcome.session,
                "completed": isinstance(outcome, TurnCompleted),
                "content": getattr(outcome, "content", None),
                "reason": str(getattr(outcome, "reason", "") or ""),
            },
        )


def main(argv: list[str]) -> int:
    if len(argv) not in (6, 7) or argv[1] not in ("work", "settle", "probe"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, home, journal_path, effects_path, seed = argv[1], argv[2], argv[3], argv[4], int(argv[5])
    max_seconds = float(argv[6]) if len(argv) == 7 else 60.0
    rng = random.Random(seed)
    run = f"{mode}-{seed}"
    journal = Journal(journal_path, run)
    effects = Effects(effects_path, run)
    url = os.environ.get(STORE_URL_ENV) or None
    config = Config(home=home).replace(
        store=StoreConfig(url=url),
        compact=CompactConfig(threshold_chars=2_500),
        subagents=SubagentsConfig(background=True, max_background=4),
        approvals=ApprovalsConfig(tools=("deploy", "fx__deploy")),
        loop=LoopConfig(max_steps=MAX_STEPS + 2),
        # Started and ended by the runtime; it ends by itself when its stdin closes, so a
        # SIGKILL of this process leaves no server behind.
        mcp={
            "fx": McpServerConfig(
                command=(sys.executable, str(MCP_SERVER), effects_path, run), timeout_s=30
            )
        },
    )
    requests: queue.Queue[Any] = queue.Queue()

    def told(event: TurnEvent) -> None:
        journal.event(event)
        if isinstance(event, ApprovalRequested):
            requests.put(event)

    # What the store holds as running before the start ends it: the checker tells a turn the
    # kill cut off from one whose end was stored just before the kill but never told.
    running = running_in_store(home, url)
    journal.write("starting", {"tag": mode, "running": running})
    # Subscribed from the start: the turns the last kill cut off are told ended here.
    rt = Runtime.start(
        config,
        model=ScriptedModel(make_script(rng, mode == "settle")),
        tools=tools(effects),
        subscribe=[told],
    )
    journal.write("started", {"tag": mode})
    stop = threading.Event()
    outcomes = Outcomes()
    rt.directory.register(OUTCOMES, outcomes)
    if mode == "probe":
        try:
            probe(rt, journal, outcomes)
        finally:
            rt.stop()
        journal.write("probed", {"tag": mode})
        return 0
    person = threading.Thread(
        target=decider, args=(rt, journal, random.Random(seed + 1), requests, stop), daemon=True
    )
    person.start()
    for pending in rt.pending_approvals():
        requests.put(pending)
    deadline = time.monotonic() + max_seconds

    def send(session: str, text: str) -> None:
        output = SCHEMA if session == TYPED else None
        with contextlib.suppress(RuntimeError):  # stopping
            rt.send_turn(session, text, reply_to=OUTCOMES, output=output)

    try:
        if mode == "work":
            for session in SESSIONS:
                rt.send_turn(session, f"start {seed}", reply_to=OUTCOMES)
            rt.send_turn(TYPED, f"start {seed}", reply_to=OUTCOMES, output=SCHEMA)
            turns = 0
            while time.monotonic() < deadline:
                try:
                    outcome = outcomes.queue.get(timeout=STALL_S)
                except queue.Empty:
                    print(f"killloop_driver: no turn ended in {STALL_S} s", file=sys.stderr)
                    return 3
                turns += 1
                journal.write(
                    "outcome",
                    {
                        "tag": type(outcome).__name__,
                        "session": outcome.session,
                        "completed": isinstance(outcome, TurnCompleted),
                        "content": getattr(outcome, "content", None),
                        "reason": str(getattr(outcome, "reason", "") or ""),
                    },
                )
                again = (outcome.session, f"turn {turns} {seed}")
                if "busy" in str(getattr(outcome, "reason", "")).lower():
                    # A background report's turn holds the session: try again a little later.
                    threading.Timer(0.05, send, again).start()
                else:
                    send(*again)
        else:
            for session in (*SESSIONS, TYPED):
                rt.wait_family(session, timeout=max(1.0, deadline - time.monotonic()))
            while rt.pending_approvals():
                for pending in rt.pending_approvals():
                    requests.put(pending)
                for session in (*SESSIONS, TYPED):
                    rt.wait_family(session, timeout=max(1.0, deadline - time.monotonic()))
            journal.write("settled", {"tag": mode})
    finally:
        stop.set()
        rt.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
