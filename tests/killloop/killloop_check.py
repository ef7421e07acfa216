"""The kill loop's checks: the store after a kill and a settling start, against what was told.

Each check reads three things: the journal of the killed run (every event, outcome and decision
the process was told, written before it acted on it), the journal of the settling run that
followed on the same home, and the store as the settling run left it (the SQLite file of the
home, or the PostgreSQL database of a url); the side-effect log is the fourth. On a shared store
a fifth may come: the journal of a second process (``probe``) that started while the killed run
still held its sessions. A broken guarantee is a :class:`Violation` with its guarantee's name,
so a run can count them per guarantee.

The side-effect log has two kinds of line: a port tool's names the session and call id it ran
for; an MCP tool's (``fx__effect``, ``fx__deploy``: effects_mcp.py) names the ``key`` the model
passed in the call's arguments, since the server knows neither. A call is matched to its key
through the arguments the store holds.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.stores.base import StoredMessage
from actors.stores.sql import SqlSessionStore
from actors.stores.sqlite import SessionStore
from messages import DenyReason, denial_message

INTERRUPTED = denial_message(DenyReason.INTERRUPTED)
DECLINED_PREFIX = "Denied: a person declined this call:"
MCP_PREFIX = "fx__"
"""The kill loop's MCP tools: ``fx__effect`` and ``fx__deploy``."""

GUARANTEES = (
    "nothing told is lost",
    "at most once",
    "every turn ended at the next start",
    "background reports exactly once and right",
    "transcripts valid",
    "waiters answered",
    "one runner per family",
    "budgets counted",
)


@dataclass(frozen=True)
class Violation:
    """One broken guarantee, with where and what."""

    guarantee: str
    session: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.guarantee}] {self.session}: {self.detail}"


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Every whole line of a journal (a line cut off by the kill is not a thing told)."""
    if not path.exists():
        return []
    out = []
    for raw in path.read_bytes().split(b"\n"):
        if raw:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
    return out


def events(lines: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    return [line["event"] for line in lines if line["kind"] == "event" and line["tag"] == tag]


class StoreView:
    """The sessions of a home as the store has them, read once per check: the SQLite file
    ``db``, or the PostgreSQL database at ``url`` (through the store loopd itself uses)."""

    def __init__(self, db: Path | None, url: str | None = None) -> None:
        self._db = db
        self._url = url
        self._histories: dict[str, list[StoredMessage]] = {}
        with self._open() as store:
            self.ids = {info.id for info in store.list_sessions()}
            # After the settling run: what the store still holds as running.
            self.running = {record.id for record in store.interrupted()}
        self.untold_ends: list[str] = []
        """Sessions whose turn's end was stored but not told before the kill."""
        self.mcp: Counter[str] = Counter()
        """What the iteration did with MCP calls, for the loop's figures (not violations)."""

    def _open(self) -> SqlSessionStore:
        if self._url is not None:
            from actors.stores.postgres import PgSessionStore

            return PgSessionStore(self._url, connect_timeout_s=10)
        assert self._db is not None
        return SessionStore(self._db)

    def history(self, session: str) -> list[StoredMessage]:
        if session not in self._histories:
            if session not in self.ids:
                self._histories[session] = []
            else:
                with self._open() as store:
                    self._histories[session] = store.history(session)
        return self._histories[session]

    def call_of(self, session: str, call_id: int) -> tuple[str, str] | None:
        """The stored call ``call_id`` of ``session``: its tool's name and its arguments."""
        for stored in self.history(session):
            for call in stored.message.tool_calls:
                if call.id == call_id:
                    return call.name, call.arguments
        return None

    def mcp_key(self, session: str, call_id: int) -> str | None:
        """The key an MCP call of the loop's server passed (its effect line names it)."""
        call = self.call_of(session, call_id)
        if call is None or not call[0].startswith(MCP_PREFIX):
            return None
        try:
            key = json.loads(call[1]).get("key")
        except (ValueError, AttributeError):
            return None
        return key if isinstance(key, str) else None

    def result_of(self, session: str, call_id: int) -> str | None:
        for stored in self.history(session):
            m = stored.message
            if m.role == "tool" and m.tool_call_id == call_id:
                return m.content or ""
        return None


def check_iteration(
    work: list[dict[str, Any]],
    settle: list[dict[str, Any]],
    effects: list[dict[str, Any]],
    view: StoreView,
    settled: bool,
) -> list[Violation]:
    """Every guarantee, for what the killed run ``work`` was told and the ``settle`` run did."""
    found: list[Violation] = []

    def bad(guarantee: str, session: str, detail: str) -> None:
        found.append(Violation(guarantee, session, detail))

    lost = "nothing told is lost"
    if not settled:
        bad("waiters answered", "-", "the settling start did not settle (hung or failed)")

    # A model answer told is stored.
    for e in events(work, "ModelAnswered"):
        tools = tuple(e.get("tools") or ())
        stored = [
            s.message
            for s in view.history(e["session"])
            if s.message.role == "assistant"
            and s.message.content == e["content"]
            and tuple(c.name for c in s.message.tool_calls) == tools
        ]
        if not stored:
            bad(lost, e["session"], f"ModelAnswered step {e['step']} told, answer not stored")
        elif not any(_usage(m.usage) == _usage(e.get("usage")) for m in stored):
            # The tokens told with an answer are stored with it: what a resumed turn's budget
            # counts from.
            told = _usage(e.get("usage"))
            kept = [_usage(m.usage) for m in stored]
            bad(
                "budgets counted",
                e["session"],
                f"ModelAnswered step {e['step']} told usage {told}, stored {kept}",
            )

    # A result told is stored, and is the result told (not the interrupted denial).
    completed_children = {
        (e["session"], e["call_id"]): e["child"]
        for e in events(work, "SubagentFinished")
        if e["completed"]
    }
    background = {e["child"] for e in events(work + settle, "SubagentStarted") if e["background"]}
    for e in events(work, "ToolCallFinished"):
        result = view.result_of(e["session"], e["call_id"])
        if result is None:
            bad(lost, e["session"], f"ToolCallFinished of call {e['call_id']} told, not stored")
        elif result == INTERRUPTED:
            bad(lost, e["session"], f"call {e['call_id']} finished and told, stored interrupted")
    for (session, call_id), child in completed_children.items():
        if child in background:
            continue
        result = view.result_of(session, call_id)
        if result is not None and not result.startswith(f"{child} completed"):
            bad(lost, session, f"{child} told completed, parent's call stored {result[:60]!r}")

    # A decision told is stored, never asked again, and the call answered as decided.
    asked_again = {(e["session"], e["call_id"]) for e in events(settle, "ApprovalRequested")}
    for line in work:
        if line["kind"] != "decision" or line["tag"] != "ApprovalSettled":
            continue
        d = line["decision"]
        key = (d["session"], d["call_id"])
        if key in asked_again:
            bad(lost, d["session"], f"call {d['call_id']} decided and told, asked again")
        result = view.result_of(*key)
        if result is None:
            continue  # checked below: a waiting call's turn must end or resume
        if d["approved"] and result.startswith(DECLINED_PREFIX):
            bad(lost, d["session"], f"call {d['call_id']} approved and told, stored declined")
        if not d["approved"] and not result.startswith(DECLINED_PREFIX):
            bad(lost, d["session"], f"call {d['call_id']} declined and told, stored {result!r}")

    # A completed turn told to its caller is stored.
    for line in work:
        if line["kind"] == "outcome" and line["completed"]:
            contents = {s.message.content for s in view.history(line["session"])}
            calls = {
                c.arguments
                for s in view.history(line["session"])
                for c in s.message.tool_calls
                if c.name == "final_answer"
            }
            answered = line["content"] in contents or any(
                _same_json(line["content"], a) for a in calls
            )
            if not answered:
                bad(lost, line["session"], f"TurnCompleted told, answer {line['content']!r} lost")

    # At most once: a side effect per call (a port call's by its session and call id, an MCP
    # call's by its key), none for a declined call, and none in the settling run for a call
    # answered that it was cut off.
    ran = Counter((e["session"], e["call_id"]) for e in effects if "key" not in e)
    ran_mcp = Counter(e["key"] for e in effects if "key" in e)
    for (session, call_id), n in ran.items():
        if n > 1:
            bad("at most once", session, f"call {call_id} ran {n} times")
    for key, n in ran_mcp.items():
        if n > 1:
            bad("at most once", key.partition(":")[0], f"MCP call with key {key} ran {n} times")

    def effects_of(session: str, call_id: int) -> list[dict[str, Any]]:
        key = view.mcp_key(session, call_id)
        if key is not None:
            return [e for e in effects if e.get("key") == key]
        return [e for e in effects if e.get("session") == session and e.get("call_id") == call_id]

    for line in work + settle:
        if line["kind"] == "decision" and line["tag"] == "ApprovalSettled":
            d = line["decision"]
            if not d["approved"] and effects_of(d["session"], d["call_id"]):
                bad("at most once", d["session"], f"call {d['call_id']} declined, and it ran")
    settle_runs = {line["run"] for line in settle}
    for e in events(work, "ToolCallStarted"):
        if e["name"] not in ("effect", "deploy") and not e["name"].startswith(MCP_PREFIX):
            continue
        if view.result_of(e["session"], e["call_id"]) != INTERRUPTED:
            continue
        if any(x["run"] in settle_runs for x in effects_of(e["session"], e["call_id"])):
            detail = f"call {e['call_id']} ({e['name']}) answered cut off, and it ran again"
            bad("at most once", e["session"], detail)
    _count_mcp(work, effects, view)

    # Every turn started is ended: by the run itself, or at the next start.
    open_turns: dict[str, int] = defaultdict(int)
    for line in work:
        if line["kind"] != "event":
            continue
        if line["tag"] == "TurnStarted":
            open_turns[line["event"]["session"]] += 1
            if line["event"]["session"] not in view.ids:
                bad(
                    "every turn ended at the next start",
                    line["event"]["session"],
                    "TurnStarted told, session not stored",
                )
        elif line["tag"] == "TurnEnded" and open_turns[line["event"]["session"]] > 0:
            open_turns[line["event"]["session"]] -= 1
    # The settling run ends each of them at its start (crashed) or resumes it to its end;
    # it starts no work of its own, so each cut-off turn has a TurnEnded there.
    ended_in_settle: Counter[str] = Counter(
        line["event"].get("session")
        for line in settle
        if line["kind"] == "event" and line["tag"] == "TurnEnded"
    )
    running_at_start = {
        session for line in settle if line["kind"] == "starting" for session in line["running"]
    }
    for session, n in open_turns.items():
        if n > 0 and not ended_in_settle[session]:
            if session not in running_at_start:
                # Its end was stored and the kill came before TurnEnded was told: the start
                # finds nothing running, and the store holds the outcome.
                view.untold_ends.append(session)
                continue
            bad("every turn ended at the next start", session, "cut off and never ended")
    for session in sorted(view.running):
        bad("every turn ended at the next start", session, "still stored running at the end")

    # Background children report exactly once, and a told completion reports completed.
    for child in background:
        parent = child.removeprefix("sub-").rpartition("-")[0]
        reports = [
            s.message.content or ""
            for s in view.history(parent)
            if s.message.role == "user"
            and s.message.name == "subagent"
            and (s.message.content or "").startswith(f"{child} ")
        ]
        if len(reports) != 1:
            bad("background reports exactly once and right", child, f"{len(reports)} reports")
        elif (child in completed_children.values()) and not reports[0].startswith(
            f"{child} completed"
        ):
            bad(
                "background reports exactly once and right",
                child,
                f"told completed, reported {reports[0][:60]!r}",
            )

    # Transcripts valid, and nothing left open once the home settled.
    touched = {line["event"].get("session") for line in work + settle if line["kind"] == "event"}
    for session in sorted(s for s in touched if s):
        for problem in transcript_problems(view.history(session)):
            left_open = problem.endswith("after the home settled")
            bad(
                "every turn ended at the next start" if left_open else "transcripts valid",
                session,
                problem,
            )
    return found


def _count_mcp(work: list[dict[str, Any]], effects: list[dict[str, Any]], view: StoreView) -> None:
    """The iteration's MCP figures, in ``view.mcp``: calls that ran in the killed run, results
    told, calls the kill cut off (stored as the interrupted denial; some after the server ran
    them, some approved by a person first)."""
    runs = {line["run"] for line in work}
    view.mcp["ran"] += sum(1 for e in effects if "key" in e and e["run"] in runs)
    told = [e for e in events(work, "ToolCallFinished") if e["name"].startswith(MCP_PREFIX)]
    view.mcp["told finished"] += len(told)
    approved = {
        (e["session"], e["call_id"]) for e in events(work, "ApprovalSettled") if e["approved"]
    } | {
        (line["decision"]["session"], line["decision"]["call_id"])
        for line in work
        if line["kind"] == "decision" and line["tag"] == "ApprovalSettled"
        if line["decision"]["approved"]
    }
    keys = {e["key"] for e in effects if "key" in e}
    for e in events(work, "ToolCallStarted"):
        key = view.mcp_key(e["session"], e["call_id"])
        if key is None or view.result_of(e["session"], e["call_id"]) != INTERRUPTED:
            continue
        view.mcp["cut off"] += 1
        view.mcp["cut off after it ran"] += key in keys
        view.mcp["cut off, approved"] += (e["session"], e["call_id"]) in approved


def check_probe(probe: list[dict[str, Any]]) -> list[Violation]:
    """A second process that started and stopped while the killed run held every session of
    its families: it ran no turn, ended none, decided no call and answered every turn it was
    asked (``busy``)."""
    found: list[Violation] = []
    rule = "one runner per family"
    for line in probe:
        event = line.get("event") or {}
        if line["kind"] == "event" and line["tag"] == "TurnStarted":
            detail = "a second process started a turn of a session the live holder runs"
            found.append(Violation(rule, event.get("session", "-"), detail))
        elif line["kind"] == "event" and line["tag"] == "TurnEnded" and event["reason"] != "busy":
            # A turn it was refused ends busy; any other end is one of the holder's turns.
            detail = f"a second process ended a turn the live holder runs ({event['reason']})"
            found.append(Violation(rule, event.get("session", "-"), detail))
        elif line["kind"] == "decision" and line["tag"] == "ApprovalSettled":
            d = line["decision"]
            detail = f"a second process decided call {d['call_id']} of a held session"
            found.append(Violation(rule, d["session"], detail))
        elif line["kind"] == "outcome" and (line["completed"] or "busy" not in line["reason"]):
            detail = f"a second process was answered {line['tag']} {line['reason']!r}, not busy"
            found.append(Violation(rule, line["session"], detail))
    if not any(line["kind"] == "probed" for line in probe):
        found.append(Violation("waiters answered", "-", "the second process did not finish"))
    elif sum(1 for line in probe if line["kind"] == "outcome") != 3:
        found.append(Violation("waiters answered", "-", "a turn of the second process unanswered"))
    return found


def _usage(usage: Any) -> tuple[int, int, int]:
    """Prompt tokens, completion tokens and requests of a usage (a Usage, its JSON, or None)."""
    if usage is None:
        return (0, 0, 0)
    if isinstance(usage, dict):
        return (
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
            usage.get("requests", 0),
        )
    return (usage.prompt_tokens, usage.completion_tokens, usage.requests)


def _same_json(a: str | None, b: str) -> bool:
    try:
        return a is not None and json.loads(a) == json.loads(b)
    except ValueError:
        return False


def transcript_problems(history: list[StoredMessage]) -> list[str]:
    """Call ids 1, 2, 3...; every tool message answers a call of the assistant message before
    it, once (an answer's results in any order: each is stored as it comes, and the model
    reads them in call order); no call left without a result."""
    problems: list[str] = []
    used: list[int] = []
    pending: list[int] = []
    for s in history:
        m = s.message
        if m.role == "tool":
            if m.tool_call_id in pending:
                pending.remove(m.tool_call_id)
            else:
                problems.append(f"message {s.seq} answers call {m.tool_call_id}, not an open call")
            continue
        if pending:
            problems.append(f"message {s.seq} follows calls {pending} without results")
            pending = []
        used.extend(c.id for c in m.tool_calls)
        pending = [c.id for c in m.tool_calls]
    if pending:
        problems.append(f"calls {pending} have no result after the home settled")
    if used != list(range(1, len(used) + 1)):
        problems.append(f"call ids are not 1, 2, 3...: {used[:20]}")
    return problems
