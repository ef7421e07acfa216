"""The turns a crash cut off, ended by the next start (SPEC 18: every turn is accounted for).

A turn's session is stored as running from the turn's first write to the write that ends it.
What is still marked when a runtime starts was cut off: unless it resumes (a call of its family
waits for a person, and the Context carries the family on from the store), its open calls get
their results (``<child> failed`` for a child, the interrupted denial for any other call) and
the mark is cleared, in one transaction, before anything else of the runtime runs; then each
gets ``TurnEnded(completed=False, reason=CRASHED)``, told to the subscribers given to
``Runtime.start(..., subscribe=[...])``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from actors.core.agents import Agents
from actors.core.session_state import SessionState, repair_results
from actors.stores.base import StoreBackend
from messages import FailReason, SessionRecord, StoredApproval, TurnEnded, TurnEvent
from messages.ids import CHILD_PREFIX

__all__ = ["CRASHED_DETAIL", "end_interrupted", "tell_start_subscribers"]

log = logging.getLogger(__name__)

CRASHED_DETAIL = "the process stopped during this turn; the next start ended it"
"""The ``detail`` of a cut-off turn's ``TurnEnded``."""


def resuming(records: Sequence[SessionRecord], waiting: Iterable[StoredApproval]) -> set[str]:
    """The sessions of ``records`` whose turn resumes: those with a call that waits for a
    person, and their ancestors (whose ``subagent`` calls wait for them). A call that began to
    run (``ran``) does not resume, nor does a background child's: the Context drops them."""
    parents = {r.id: r.parent for r in records}
    out: set[str] = set()
    for entry in waiting:
        session: str | None = entry.request.session
        if entry.ran or (entry.background and entry.request.session.startswith(CHILD_PREFIX)):
            continue
        while session is not None and session not in out:
            out.add(session)
            session = parents.get(session)
    return out


def end_interrupted(
    store: StoreBackend, agents: Agents, clock: Callable[[], datetime]
) -> list[TurnEnded]:
    """End every cut-off turn of ``store`` that does not resume; their ``TurnEnded`` events."""
    records = store.interrupted()
    if not records:
        return []
    keep = resuming(records, store.approvals())
    ended = [r for r in records if r.id not in keep]
    now = clock()
    jobs: list[tuple[str, Callable[[Any], None]]] = []
    for record in ended:
        state = SessionState.from_record(record)
        agent = record.agent if record.agent in agents else "default"
        repairs = repair_results(state, agents.get(agent).registry, now)
        jobs.append((record.id, _end_job(store, record, repairs)))
    failed = [
        (session, result)
        for (session, _), result in zip(jobs, store.run_batch(jobs), strict=True)
        if isinstance(result, Exception)
    ]
    for session, error in failed:  # it stays marked: the next start tries again
        log.error("loopd: could not end the cut-off turn of %s: %s", session, error)
    done = {session for session, _ in failed}
    events = [
        TurnEnded(session=r.id, completed=False, reason=FailReason.CRASHED, detail=CRASHED_DETAIL)
        for r in ended
        if r.id not in done
    ]
    if events:
        log.warning("loopd: ended %d turns a crash cut off: %s", len(events), _names(events))
    return events


def _end_job(store: StoreBackend, record: SessionRecord, repairs: tuple[Any, ...]) -> Any:
    def job(cur: Any) -> None:
        store.append_in(
            cur,
            record.id,
            repairs,
            turns=record.turns,
            next_call_id=record.next_call_id,
            untrusted=record.untrusted,
            running=False,
        )

    return job


def _names(events: Sequence[TurnEnded]) -> str:
    names = [e.session for e in events[:10]]
    return ", ".join(names) + (f" and {len(events) - 10} more" if len(events) > 10 else "")


def tell_start_subscribers(
    subscribers: Iterable[Callable[[TurnEvent], Any]], events: Sequence[TurnEvent]
) -> None:
    """Tell each of ``events`` to each subscriber, in order, on this thread. A subscriber that
    raises is logged and goes on getting the rest (an optional part never stops a start)."""
    for event in events:
        for fn in subscribers:
            try:
                fn(event)
            except Exception:
                log.exception("loopd: a start subscriber raised on %s", type(event).__name__)
