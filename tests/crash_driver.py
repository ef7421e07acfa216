"""The process that tests/test_crash.py kills: turns on a few sessions, forever, until SIGKILL.

    python tests/crash_driver.py HOME SEED [MAX_SECONDS]

It starts a Runtime on HOME with a ScriptedModel whose answers are drawn from a random generator
seeded with SEED: plain replies, ``clock`` calls, one to three ``subagent`` calls per answer
(children sometimes spawn a grandchild), now and then a model error, and a compaction when a
transcript grows past a small threshold. The top-level sessions run turns concurrently, each
starting its next turn as soon as the last one ends. The model "thinks" a random few
milliseconds per request, so a kill lands at different points of different turns.

After every ended turn it prints one JSON line to stdout (flushed), for example
``{"turn": 7, "session": "crash-b", "completed": true, "content": "crash-b answer 1f3a..."}``.
The content of a completed top-level turn is unique, so the test can look for it in the store.

This is a helper script, not a test module: it has no tests. It stops by itself after
MAX_SECONDS (default 120) so that it never outlives a test run that lost track of it.
"""

from __future__ import annotations

import json
import queue
import random
import sys
import time
from typing import Any

from actors import CompactConfig, Config, ModelFailure, Runtime
from actors.core.turn import COMPACT_INSTRUCTION
from actors.testing import ScriptedModel, calls, reply
from actors.testing.script import Answer
from messages import ModelRequest, TurnCompleted

SESSIONS = ("crash-a", "crash-b", "crash-c")
"""The top-level sessions; the same on every start, so each start goes on where the last died."""

THINK_S = 0.02
"""The longest pause of one model request."""

MAX_STEPS_PER_TURN = 3
"""Model answers with tool calls per turn, at most; the next answer is a plain reply."""

COMPACT_THRESHOLD = 3_000
"""Characters of transcript past which a session is compacted (small, so it happens)."""

STALL_S = 30.0
"""No turn ending for this long means something hangs: exit with an error, do not wait."""

OUTCOMES = "crash-driver"
"""The address the turns' outcomes are sent to."""


class Outcomes:
    """A mailbox outside the actors: the runtime tells it each turn's outcome."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()

    def tell(self, message: Any) -> None:
        self.queue.put(message)


def depth(session: str) -> int:
    """0 for a top-level session, 1 for a child, 2 for a grandchild."""
    return session.count("sub-")


def steps_this_turn(request: ModelRequest) -> int:
    """Model answers with tool calls since the turn's user message."""
    steps = 0
    for message in reversed(request.messages):
        if message.role == "user":
            break
        if message.role == "assistant" and message.tool_calls:
            steps += 1
    return steps


def subagent_calls(rng: random.Random, session: str, n: int, with_clock: bool) -> Answer:
    items: list[tuple[str, str | dict[str, Any]]] = [
        ("subagent", {"task": f"part {i} of a task from {session}"}) for i in range(1, n + 1)
    ]
    if with_clock:
        items.insert(rng.randrange(len(items) + 1), ("clock", {}))
    return calls(*items)


def make_script(rng: random.Random):
    """The model: a function of each request, drawing its choices from ``rng``."""

    def script(request: ModelRequest) -> Answer:
        session = request.session
        last = request.messages[-1]
        # The simulated model's think time, inside the process that gets killed: it spreads
        # the kills over more points of a turn. No test waits by sleeping.
        time.sleep(rng.uniform(0, THINK_S))
        if last.role == "user" and last.content == COMPACT_INSTRUCTION:
            return reply(f"{session} so far: some turns, some children, some clock readings.")
        if rng.random() < 0.03:
            raise ModelFailure("the scripted model failed on purpose")
        level = depth(session)
        if steps_this_turn(request) >= MAX_STEPS_PER_TURN or (
            last.role == "tool" and rng.random() < 0.6
        ):
            if level == 0:
                return reply(f"{session} answer {rng.getrandbits(48):012x}")
            return reply(f"{session} done")
        roll = rng.random()
        if level == 0:
            if roll < 0.2:
                return reply(f"{session} answer {rng.getrandbits(48):012x}")
            if roll < 0.45:
                return calls(("clock", {}))
            return subagent_calls(rng, session, rng.randint(1, 3), rng.random() < 0.3)
        if level == 1 and roll < 0.25:
            return subagent_calls(rng, session, 1, rng.random() < 0.3)
        if roll < 0.6:
            return reply(f"{session} done")
        return calls(("clock", {}))

    return script


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print("usage: crash_driver.py HOME SEED [MAX_SECONDS]", file=sys.stderr)
        return 2
    home, seed = argv[1], int(argv[2])
    max_seconds = float(argv[3]) if len(argv) == 4 else 120.0
    rng = random.Random(seed)
    config = Config(home=home)
    config = config.replace(compact=CompactConfig(threshold_chars=COMPACT_THRESHOLD))
    rt = Runtime.start(config, model=ScriptedModel(make_script(rng)))
    outcomes = Outcomes()
    rt.directory.register(OUTCOMES, outcomes)
    ended = 0
    try:
        for session in SESSIONS:
            rt.send_turn(session, f"start {seed}", reply_to=OUTCOMES)
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            try:
                outcome = outcomes.queue.get(timeout=STALL_S)
            except queue.Empty:
                print(f"crash_driver: no turn ended in {STALL_S} s", file=sys.stderr)
                return 3
            ended += 1
            completed = isinstance(outcome, TurnCompleted)
            line = {
                "turn": ended,
                "session": outcome.session,
                "completed": completed,
                "content": outcome.content if completed else str(outcome.reason),
            }
            print(json.dumps(line), flush=True)
            rt.send_turn(outcome.session, f"turn {ended} {seed}", reply_to=OUTCOMES)
    except KeyboardInterrupt:
        return 130
    finally:
        rt.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
