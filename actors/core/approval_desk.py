"""The Context's side of approvals: the table of waiting calls and every decision (SPEC 11).

:class:`ApprovalDesk` belongs to a :class:`~actors.core.context_state.ContextState` and returns
effects as it does. The rules it keeps:

- a call is announced (``ApprovalRequested``) only once its session has stored it;
- a decision (``ApproveCall``, ``DenyCall``, the timeout) takes the call off the table, so of
  two decisions exactly one is applied and the other is answered ``ApprovalRefused``;
- a decision is recorded in the store, published (``ApprovalSettled``) and told to the turn; a
  turn that was cut off (a stop, a crash: the call was read back from the store at the start)
  is resumed by it, from its stored transcript;
- ``loop.child_timeout_s`` does not run while a child, or a descendant of it, waits;
- a session whose call waits after a restart stays held, so a new turn is answered busy, and a
  cancel drops its requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from actors.core.approvals import (
    NOT_WAITING,
    ApprovalBook,
    ArmApprovalTimer,
    CancelApprovalTimer,
    timeout_reason,
)
from actors.core.budget import Budgets
from actors.core.config import Config
from actors.core.context_effects import CancelTimer as CancelChildTimer
from actors.core.context_effects import (
    ContextEffect,
    Emit,
    Reply,
    StartTimer,
    StopSession,
    TellSession,
    ToSession,
    ToStore,
)
from actors.core.dispatch import descends_from
from actors.core.holds import Hold, HoldTable, Live
from actors.core.passivation import IdleSessions
from messages import (
    ApprovalDecision,
    ApprovalRefused,
    ApprovalSettled,
    ApprovalTimedOut,
    ApproveCall,
    DenyCall,
    DropApprovals,
    Park,
    Parked,
    Resume,
    SettleApproval,
    StoredApproval,
)
from messages.ids import CHILD_PREFIX

__all__ = ["ApprovalDesk"]

Effects = list[ContextEffect]


class ContextState(Protocol):
    """What the desk uses of :class:`actors.core.context_state.ContextState` (named here, not
    imported, so the Context's state and its approval desk do not import each other)."""

    config: Config
    holds: HoldTable
    budgets: Budgets | None
    live: dict[str, Live]
    idle: IdleSessions

    @property
    def clock(self) -> Callable[[], datetime]: ...
    def reopen(self, hold: Hold) -> Effects: ...
    def give_back(self, session: str) -> Effects: ...


class ApprovalDesk:
    """The waiting calls of one runtime, and what each decision does."""

    def __init__(self, state: ContextState) -> None:
        self.state = state
        self.book = ApprovalBook()
        self.paused: set[str] = set()
        """Children whose ``loop.child_timeout_s`` timer is paused while a call waits."""
        self.parking: dict[str, list[ApprovalDecision]] = {}
        """Sessions told ``Park``, with the decisions that came meanwhile."""

    # Requests.

    def requested(self, entry: StoredApproval) -> Effects:
        """A session stored a waiting call: publish it, arm its timeout, pause child timers."""
        request = entry.request
        self.book.add(entry)
        effects: Effects = [Emit(request), self._arm(entry)]
        return effects + self._pause(request.session)

    def restore(self, entries: Sequence[StoredApproval]) -> Effects:
        """At the start: the stored approvals of a runtime that stopped or crashed. Each
        session whose calls wait is held (no actor yet) until a decision resumes it; a decision
        recorded meanwhile (the CLI) resumes it now. A child's are dropped: its parent's turn
        ended with the runtime."""
        effects: Effects = []
        decided: dict[str, list[ApprovalDecision]] = {}
        for entry in entries:
            request = entry.request
            if request.session.startswith(CHILD_PREFIX):
                drop = DropApprovals(request.session, (request.call_id,))
                effects.append(ToStore(drop))
                continue
            self._hold(request.session)
            if entry.approved is None:
                self.book.add(entry, live=False)
                effects.append(self._arm(entry))
            else:
                decision = ApprovalDecision(request.call_id, entry.approved, entry.reason)
                decided.setdefault(request.session, []).append(decision)
        for session, decisions in decided.items():
            effects += self._resume(session, decisions)
        return effects

    def dropped(self, msg: DropApprovals) -> Effects:
        """A turn ended (cancelled) while its calls waited: they are no longer waiting."""
        effects: Effects = []
        for call_id in msg.call_ids:
            if self.book.take(msg.session, call_id) is not None:
                effects.append(CancelApprovalTimer(msg.session, call_id))
        return [*effects, ToStore(msg), *self._unpause()]

    def cancelled(self, session: str) -> Effects:
        """``session``'s turn is cancelled: requests read back at the start are dropped here
        (a live turn drops its own when it ends)."""
        waiting = [w for w in self.book.of(session) if not w.live]
        if not waiting:
            return []
        ids = tuple(w.entry.request.call_id for w in waiting)
        for call_id in ids:
            self.book.take(session, call_id)
        timers: Effects = [CancelApprovalTimer(session, call_id) for call_id in ids]
        return [*timers, ToStore(DropApprovals(session, ids))]

    def stored_only(self, session: str) -> bool:
        """Whether ``session``'s turn is parked: its calls wait in the store, no actor runs it
        (since the start, or passivated)."""
        waiting = self.book.of(session)
        return bool(waiting) and not any(w.live for w in waiting)

    # Decisions.

    def approve(self, msg: ApproveCall) -> Effects:
        """A person said yes."""
        return self._settle(msg.session, msg.call_id, True, msg.note or "", msg.reply_to)

    def deny(self, msg: DenyCall) -> Effects:
        """A person said no."""
        return self._settle(msg.session, msg.call_id, False, msg.reason, msg.reply_to)

    def timed_out(self, msg: ApprovalTimedOut) -> Effects:
        """Nobody decided within ``approvals.timeout_s``: the call is declined."""
        reason = timeout_reason(self.state.config.approvals.timeout_s)
        return self._settle(msg.session, msg.call_id, False, reason, None, timer_fired=True)

    def _settle(
        self,
        session: str,
        call_id: int,
        approved: bool,
        reason: str,
        reply_to: str | None,
        *,
        timer_fired: bool = False,
    ) -> Effects:
        waiting = self.book.take(session, call_id)
        if waiting is None:
            if timer_fired:
                return []
            detail = NOT_WAITING.format(call_id=call_id, session=session)
            return self._reply(reply_to, ApprovalRefused(session, call_id, detail))
        settled = ApprovalSettled(session=session, call_id=call_id, approved=approved)
        effects: Effects = [CancelApprovalTimer(session, call_id)]
        effects += [ToStore(SettleApproval(session, call_id, approved, reason)), Emit(settled)]
        effects += self._reply(reply_to, settled)
        # Only the reason a person gave goes to the model; a note stays with the decision.
        decision = ApprovalDecision(call_id, approved, "" if approved else reason)
        if waiting.live and session in self.parking and session in self.state.live:
            self.parking[session].append(decision)  # carried out once it answers Parked
        elif waiting.live:
            effects += self._deliver(session, decision)
        else:
            effects += self._resume(session, [decision])
        return effects + self._unpause()

    def _deliver(self, session: str, decision: ApprovalDecision) -> Effects:
        """Tell the turn its decision: to its actor's ref (so it queues behind the RunTurn
        that resumed it), or, while the resumed session is still being opened, into the
        resume it will start with."""
        state = self.state
        live, hold = state.live.get(session), state.holds.get(session)
        if live is not None:
            return [TellSession(session, live.incarnation, live.ref, decision)]
        if hold is not None and hold.resume is not None:
            waiting = tuple(c for c in hold.resume.waiting if c != decision.call_id)
            hold.resume = Resume((*hold.resume.decisions, decision), waiting)
            return []
        return [ToSession(session, decision)]

    @staticmethod
    def _reply(to: str | None, message: ApprovalSettled | ApprovalRefused) -> Effects:
        return [Reply(to, message)] if to is not None else []

    # Passivating a session that waits.

    def passivate(self, now: float, idle_s: float) -> Effects:
        """Ask every live top-level session whose calls have waited ``idle_s`` to park, so
        its actor can go (``sessions.idle_s``); it answers ``Parked``."""
        effects: Effects = []
        state = self.state
        for request in self.book.pending():
            session = request.session
            if now - request.at.timestamp() < idle_s:
                break  # oldest first: the rest waited less
            hold, live = state.holds.get(session), state.live.get(session)
            if session in self.parking or hold is None or hold.is_child or live is None:
                continue
            if live.incarnation != hold.incarnation or not all(
                w.live for w in self.book.of(session)
            ):
                continue
            self.parking[session] = []
            effects.append(TellSession(session, live.incarnation, live.ref, Park()))
        return effects

    def parked(self, msg: Parked) -> Effects:
        """A session's answer to ``Park``: parked, its actor goes and its calls wait in the
        store (a decision resumes it); not parked, the decisions that came meanwhile go on."""
        decisions = self.parking.pop(msg.session, [])
        state = self.state
        hold, live = state.holds.get(msg.session), state.live.get(msg.session)
        if not msg.parked or hold is None or live is None or live.incarnation != msg.incarnation:
            return [ToSession(msg.session, d) for d in decisions]
        for waiting in self.book.of(msg.session):
            waiting.live = False
        del state.live[msg.session]
        hold.incarnation = 0  # its actor's SessionStopped then changes nothing
        effects: Effects = [StopSession(live.ref), *state.give_back(msg.session)]
        if decisions:
            effects += self._resume(msg.session, decisions)
        return effects

    # Resuming a turn that was cut off.

    def _hold(self, session: str) -> None:
        state = self.state
        if state.holds.get(session) is not None:
            return
        state.holds.hold(Hold(session, ""))
        state.idle.busy(session)
        if state.budgets is not None:
            state.budgets.open(session)

    def _resume(self, session: str, decisions: list[ApprovalDecision]) -> Effects:
        """Open ``session`` and continue its turn with ``decisions``; its other calls keep
        waiting, now for the resumed turn."""
        hold = self.state.holds.get(session)
        if hold is None:
            return []
        still = self.book.of(session)
        for waiting in still:
            waiting.live = True
        ids = tuple(w.entry.request.call_id for w in still)
        hold.resume = Resume(tuple(decisions), ids)
        return self.state.reopen(hold)

    # Timers.

    def _arm(self, entry: StoredApproval) -> ArmApprovalTimer:
        left = (entry.deadline - self.state.clock()).total_seconds()
        request = entry.request
        return ArmApprovalTimer(request.session, request.call_id, max(0.0, left))

    def _pause(self, session: str) -> Effects:
        """Stop the child timers of ``session`` and every child above it."""
        if self.state.config.loop.child_timeout_s is None:
            return []
        effects: Effects = []
        hold = self.state.holds.get(session)
        while hold is not None and hold.parent is not None:
            if hold.session not in self.paused:
                self.paused.add(hold.session)
                effects.append(CancelChildTimer(hold.session))
            hold = self.state.holds.get(hold.parent)
        return effects

    def _unpause(self) -> Effects:
        """Start again the timers of children that no longer wait (a full timeout each)."""
        timeout = self.state.config.loop.child_timeout_s
        effects: Effects = []
        for child in sorted(self.paused):
            if any(
                r.session == child or descends_from(r.session, child) for r in self.book.pending()
            ):
                continue
            self.paused.discard(child)
            hold = self.state.holds.get(child)
            if timeout is not None and hold is not None and not hold.answered:
                effects.append(StartTimer(child, hold.spawn, timeout))
        return effects
