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
  cancel drops its requests;
- a child's call waits across a restart too: at a stop its turn and every ancestor's park (the
  ancestors' ``subagent`` calls stay open), the next start holds the whole family, a decision
  resumes the child, and the child's outcome resumes its parent, which answers that call with
  it (and so on up). A background child's call is dropped: no parent's call waits for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import msgspec

from actors.core.approvals import (
    NOT_WAITING,
    ApprovalBook,
    ArmApprovalTimer,
    CancelApprovalTimer,
    Waiting,
    check_call_id,
    decision_text,
    past_deadline_detail,
    timeout_reason,
)
from actors.core.budget import Budgets, parent_of
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
    ApprovalsRun,
    ApprovalStored,
    ApprovalTimedOut,
    ApproveCall,
    Cancel,
    DenyCall,
    DropApprovals,
    FailReason,
    Park,
    Parked,
    RecordSpent,
    Resume,
    RunTurn,
    SettleApproval,
    StoreApproval,
    StoredApproval,
    SubagentCompleted,
    SubagentFailed,
)
from messages.ids import CHILD_PREFIX

__all__ = ["ApprovalDesk"]

Effects = list[ContextEffect]


class ContextState(Protocol):
    """What the desk uses of :class:`actors.core.context_state.ContextState` (named here, not
    imported, so the Context's state and its approval desk do not import each other)."""

    config: Config
    address: str
    holds: HoldTable
    budgets: Budgets | None
    live: dict[str, Live]
    idle: IdleSessions

    @property
    def clock(self) -> Callable[[], datetime]: ...
    def reopen(self, hold: Hold) -> Effects: ...
    def give_back(self, session: str) -> Effects: ...
    def release(self, session: str) -> Effects: ...
    def limit_denial(self, parent: str, background: bool) -> str | None: ...


@dataclass(frozen=True)
class _Settling:
    """A decision on its way to the store: what is done with it once it is committed."""

    waiting: Waiting
    settled: ApprovalSettled
    decision: ApprovalDecision
    reply_to: str | None


class ApprovalDesk:
    """The waiting calls of one runtime, and what each decision does."""

    def __init__(self, state: ContextState) -> None:
        self.state = state
        self.book = ApprovalBook()
        self.paused: set[str] = set()
        """Children whose ``loop.child_timeout_s`` timer is paused while a call waits."""
        self.parking: dict[str, list[ApprovalDecision]] = {}
        """Sessions told ``Park``, with the decisions that came meanwhile."""
        self.cancelling: dict[str, tuple[FailReason, str]] = {}
        """Sessions told ``Park`` and then cancelled: their ``Parked`` ends the turn."""
        self.children: dict[str, set[int]] = {}
        """Parents held since the start whose ``subagent`` calls wait for a child that waits
        for a person: the child's outcome resumes the parent."""
        self.settling: dict[tuple[str, int], _Settling] = {}
        """Decisions told to the store and not yet committed, by session and call id."""

    # Requests.

    def store(self, msg: StoreApproval) -> Effects:
        """A session's waiting call goes to the store through here, with what its family has
        spent (``loop.token_budget``) and whether it is a background child's; a ``subagent``
        call a spawn limit denies anyway is answered at once instead (``limit_denial``)."""
        state = self.state
        denial = state.limit_denial(msg.session, msg.background) if msg.spawns else None
        if denial is not None:  # denied anyway: nothing is stored, nobody is asked
            decision = ApprovalDecision(msg.approval.request.call_id, False, denial=denial)
            return [Reply(msg.reply_to, decision)]
        spent = state.budgets.spent(msg.session) if state.budgets is not None else 0
        background = self._background(state.holds.get(msg.session))
        entry = msgspec.structs.replace(msg.approval, spent=spent, background=background)
        return [ToStore(msgspec.structs.replace(msg, approval=entry))]

    def requested(self, entry: StoredApproval) -> Effects:
        """A session stored a waiting call: publish it, arm its timeout, pause child timers."""
        request = entry.request
        self.book.add(entry)
        effects: Effects = [Emit(request), self._arm(entry)]
        return effects + self._pause(request.session)

    def restore(self, entries: Sequence[StoredApproval]) -> Effects:
        """At the start: the stored approvals of a runtime that stopped or crashed. Each
        session whose calls wait is held (no actor yet) until a decision resumes it; a decision
        recorded meanwhile (the CLI) resumes it now. A child's holds its ancestors too, each
        waiting in its ``subagent`` call; a background child's is dropped."""
        effects: Effects = []
        decided: dict[str, list[ApprovalDecision]] = {}
        for entry in entries:
            request = entry.request
            if entry.ran:
                # Its work began before the crash: the resumed turn (or a crash's repair)
                # answers the call as interrupted; it never runs twice.
                effects.append(ToStore(DropApprovals(request.session, (request.call_id,))))
                continue
            if entry.background and request.session.startswith(CHILD_PREFIX):
                drop = DropApprovals(request.session, (request.call_id,))
                effects.append(ToStore(drop))
                continue
            self._hold_family(request.session, entry.spent)
            if entry.approved is None:
                self.book.add(entry, live=False)
                effects.append(self._arm(entry))
            else:
                decision = ApprovalDecision(
                    request.call_id,
                    entry.approved,
                    "" if entry.approved else entry.reason,
                    note=(entry.reason or None) if entry.approved else None,
                )
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

    def cancelled(
        self, session: str, reason: FailReason = FailReason.CANCELLED, detail: str = ""
    ) -> Effects:
        """``session``'s turn is cancelled: requests read back at the start are dropped here
        (a live turn drops its own when it ends). A session told ``Park`` may have parked
        already (its actor then ignores the Cancel): all its requests, and the decisions that
        came meanwhile, go now, and its ``Parked`` answers the turn cancelled
        (:meth:`parked`)."""
        self.children.pop(session, None)
        parking = session in self.parking
        # A session a decision is reopening has no actor told its resume yet: its requests,
        # and the decisions it was to carry out, are dropped here too.
        hold = self.state.holds.get(session)
        resume = hold.resume if hold is not None and not self._told(hold) else None
        waiting = [w for w in self.book.of(session) if parking or resume is not None or not w.live]
        ids = tuple(w.entry.request.call_id for w in waiting)
        if resume is not None and hold is not None:
            ids += tuple(d.call_id for d in resume.decisions)
            hold.resume = None
        if parking:
            ids += tuple(d.call_id for d in self.parking[session])
            self.parking[session] = []
            self.cancelling[session] = (reason, detail)
        # A decision still being stored for a turn no actor runs: it will carry out nothing
        # (its row goes with the others), and its decider hears the call no longer waits.
        refusals: Effects = []
        for key, pending in sorted(self.settling.items()):
            if key[0] != session or not (parking or resume is not None or not pending.waiting.live):
                continue
            del self.settling[key]
            ids += (key[1],)
            said = NOT_WAITING.format(call_id=key[1], session=session)
            refusals += self._reply(pending.reply_to, ApprovalRefused(session, key[1], said))
        if not ids:
            return []
        for call_id in ids:
            self.book.take(session, call_id)
        timers: Effects = [CancelApprovalTimer(session, call_id) for call_id in ids]
        return [*timers, ToStore(DropApprovals(session, ids)), *refusals]

    def stored_only(self, hold: Hold) -> bool:
        """Whether ``hold``'s turn is parked: its calls wait in the store, no actor runs it
        (since the start, or passivated), or its decisions are stored and no actor has been
        told them yet (a decision was reopening it): the next start carries them out."""
        session = hold.session
        if hold.resume is not None and hold.resume.decisions and not self._told(hold):
            return True
        waiting = self.book.of(session)
        if session in self.children and not waiting:  # it waits only for its children
            return session not in self.state.live
        return bool(waiting) and not any(w.live for w in waiting)

    def _told(self, hold: Hold) -> bool:
        """Whether the live actor that runs ``hold``'s turn has been told it."""
        live = self.state.live.get(hold.session)
        return live is not None and hold.incarnation != 0 and live.incarnation == hold.incarnation

    def stored_at_stop(self) -> set[str]:
        """At a stop, before the holds go: the sessions whose turns wait in the store (see
        :meth:`stored_only`), to skip. A parent that waits only for its children stays so only
        while each of them parks too: a child whose resumed turn runs again is cancelled by the
        stop (nothing of it is left to resume), so its parent's turn ends at the stop as well."""
        holds = self.state.holds
        stored = {
            s for s in holds.held() if (h := holds.get(s)) is not None and self.stored_only(h)
        }
        changed = True
        while changed:
            changed = False
            for parent, calls in self.children.items():
                if parent not in stored or self.book.of(parent):
                    continue
                kids = (f"{CHILD_PREFIX}{parent}-{n}" for n in calls)
                if not all(k in stored or self.book.of(k) for k in kids):
                    stored.discard(parent)
                    changed = True
        return stored

    def parks_at_stop(self) -> dict[str, tuple[int, ...]]:
        """At a stop: the sessions whose turns park (``Cancel(park=True)``), each with the
        ``subagent`` calls that stay open for a child that waits for a person (or whose own
        child does), also one that waits in the store since the start while its parent's
        turn runs again. Background children park nothing: no parent's call waits for them."""
        holds = self.state.holds
        kept: dict[str, set[int]] = {}
        for session in {r.session for r in self.book.pending()}:
            hold = holds.get(session)
            if hold is None or self._background(hold):
                continue
            kept.setdefault(session, set())
            while hold is not None and hold.parent is not None:
                kept.setdefault(hold.parent, set()).add(hold.call_id)
                hold = holds.get(hold.parent)
        return {session: tuple(sorted(ids)) for session, ids in kept.items()}

    def record_spent(self) -> Effects:
        """At a stop, with ``loop.token_budget``: what each waiting call's family has spent by
        now goes into its rows, so the next start counts on from there."""
        budgets = self.state.budgets
        if budgets is None:
            return []
        calls: dict[str, list[int]] = {}
        for request in self.book.pending():
            calls.setdefault(request.session, []).append(request.call_id)
        return [
            ToStore(RecordSpent(session, tuple(ids), budgets.spent(session)))
            for session, ids in sorted(calls.items())
        ]

    def stop_cancel(self, parks: dict[str, tuple[int, ...]], session: str, detail: str) -> Cancel:
        """What a stop tells ``session``'s turn (see :meth:`parks_at_stop`); a top-level turn
        always parks what it can."""
        keep = parks.get(session)
        park = keep is not None or not session.startswith(CHILD_PREFIX)
        return Cancel(FailReason.CANCELLED, detail, park=park, keep=keep or ())

    def _background(self, hold: Hold | None) -> bool:
        while hold is not None:
            if hold.background:
                return True
            hold = self.state.holds.get(hold.parent) if hold.parent is not None else None
        return False

    # Decisions.

    def approve(self, msg: ApproveCall) -> Effects:
        """A person said yes (a note kept with the decision)."""
        note = "" if msg.note is None else msg.note
        return self._decided(msg.session, msg.call_id, True, note, "the note", msg.reply_to)

    def deny(self, msg: DenyCall) -> Effects:
        """A person said no, for a reason the model reads."""
        return self._decided(
            msg.session, msg.call_id, False, msg.reason, "the reason", msg.reply_to
        )

    def _decided(
        self,
        session: str,
        call_id: int,
        approved: bool,
        text: object,
        what: str,
        reply_to: str | None,
    ) -> Effects:
        """A decision as it was told (the facades check the same before they tell it): a
        call id that is no int, or a reason or note no door would take, changes nothing and is
        answered ``ApprovalRefused`` naming it; the text is neutralised and settles the call."""
        try:
            check_call_id(call_id)
            clean = decision_text(text, what)
        except (TypeError, ValueError) as exc:
            return self._reply(reply_to, ApprovalRefused(session, call_id, str(exc)))
        return self._settle(session, call_id, approved, clean, reply_to)

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
        if not timer_fired and self.book.expired(session, call_id, self.state.clock()):
            return self._too_late(session, call_id, reply_to)
        waiting = self.book.take(session, call_id)
        if waiting is None:
            if timer_fired:
                return []
            detail = NOT_WAITING.format(call_id=call_id, session=session)
            return self._reply(reply_to, ApprovalRefused(session, call_id, detail))
        note, said = (reason or None, None) if approved else (None, reason)
        settled = ApprovalSettled(
            session=session, call_id=call_id, approved=approved, note=note, reason=said
        )
        # Only the reason a person gave goes to the model; a note stays with the decision.
        decision = ApprovalDecision(call_id, approved, said or "", note=note)
        live = session in self.state.live
        parking = waiting.live and session in self.parking and live
        # A live turn carries an approval out now: the row says so in the same transaction.
        ran = approved and waiting.live and live and not parking
        # Nobody hears of the decision, the turn included, before it is committed (SPEC 18):
        # a crash meanwhile leaves the call waiting, never decided-but-lost or run unrecorded.
        self.settling[(session, call_id)] = _Settling(waiting, settled, decision, reply_to)
        record = SettleApproval(
            session, call_id, approved, reason, ran=ran, reply_to=self.state.address
        )
        return [CancelApprovalTimer(session, call_id), ToStore(record)]

    def settled(self, msg: ApprovalStored) -> Effects:
        """The store committed a decision (or could not): now it is published, its decider
        answered and its turn told; a decision the store refused is answered
        ``ApprovalRefused`` and the call waits again."""
        pending = self.settling.pop((msg.session, msg.call_id), None)
        if pending is None:
            return []
        session, call_id = msg.session, msg.call_id
        if msg.error:
            detail = f"the decision on call {call_id} of session {session} was not stored: "
            refused = ApprovalRefused(session, call_id, detail + msg.error)
            if msg.not_waiting and not pending.waiting.live:
                # Listed at the start, but no longer this runtime's to decide: forget it.
                return self._reply(pending.reply_to, refused)
            self.book.add(pending.waiting.entry, live=pending.waiting.live)
            return [self._arm(pending.waiting.entry), *self._reply(pending.reply_to, refused)]
        effects: Effects = [Emit(pending.settled), *self._reply(pending.reply_to, pending.settled)]
        decision = pending.decision
        parking = pending.waiting.live and session in self.parking and session in self.state.live
        if parking:
            self.parking[session].append(decision)  # carried out once it answers Parked
        elif pending.waiting.live:
            effects += self._deliver(session, decision)
        else:
            effects += self._resume(session, [decision])
        return effects + self._unpause()

    def unsettled_at_stop(self, detail: str) -> Effects:
        """The runtime stops while decisions are being stored: their calls count as waiting
        (their turns park, and the next start reads whichever the store has), and their
        deciders are answered: nobody is left waiting."""
        effects: Effects = []
        for (session, call_id), pending in sorted(self.settling.items()):
            self.book.add(pending.waiting.entry, live=pending.waiting.live)
            said = (
                f"{detail} while the decision on call {call_id} of session {session} was being "
                "stored; `loopd approvals` shows whether it still waits"
            )
            effects += self._reply(pending.reply_to, ApprovalRefused(session, call_id, said))
        self.settling.clear()
        return effects

    def _too_late(self, session: str, call_id: int, reply_to: str | None) -> Effects:
        """A decision past the call's deadline, before its timer's message: the deadline is
        binding, so the decision is refused and the call is declined for its timeout now."""
        detail = past_deadline_detail(session, call_id, self.state.config.approvals.timeout_s)
        refused = ApprovalRefused(session, call_id, detail)
        return self.timed_out(ApprovalTimedOut(session, call_id)) + self._reply(reply_to, refused)

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
            decisions = (*hold.resume.decisions, decision)
            hold.resume = msgspec.structs.replace(hold.resume, decisions=decisions, waiting=waiting)
            return []
        return [ToSession(session, decision)]

    def carrying_out(self, session: str, run: RunTurn) -> Effects:
        """``session``'s actor is told ``run`` now: a resumed turn's approved decisions are
        marked carried out first (see :meth:`_ran`)."""
        return self._ran(session, run.resume.decisions) if run.resume is not None else []

    @staticmethod
    def _ran(session: str, decisions: Sequence[ApprovalDecision]) -> Effects:
        """Mark the approved ``decisions`` carried out in the store, before the turn that runs
        their work is told (the store takes its messages in order): a start after a crash
        then answers those calls as interrupted instead of running them again."""
        ids = tuple(d.call_id for d in decisions if d.approved)
        return [ToStore(ApprovalsRun(session, ids))] if ids else []

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
        cancel = self.cancelling.pop(msg.session, None)
        state = self.state
        hold, live = state.holds.get(msg.session), state.live.get(msg.session)
        if not msg.parked or hold is None or live is None or live.incarnation != msg.incarnation:
            # Not parked: the turn still ran and heard the Cancel itself.
            return [
                *self._ran(msg.session, decisions),
                *(ToSession(msg.session, d) for d in decisions),
            ]
        for waiting in self.book.of(msg.session):
            waiting.live = False
        del state.live[msg.session]
        hold.incarnation = 0  # its actor's SessionStopped then changes nothing
        effects: Effects = [StopSession(live.ref), *state.give_back(msg.session)]
        if cancel is not None:  # cancelled while it parked: its requests are gone already
            return effects + state.release(msg.session) + hold.failure(*cancel)
        if decisions:
            effects += self._resume(msg.session, decisions)
        return effects

    # Resuming a turn that was cut off.

    def _hold_family(self, session: str, spent: int) -> None:
        """Hold ``session`` and, for a child, every ancestor, each waiting in the ``subagent``
        call that spawned the one below (the call id is the last part of a child's id); the
        top-level turn's budget goes on from ``spent``."""
        self._hold(session)
        child, parent = session, parent_of(session)
        while parent is not None:
            self.children.setdefault(parent, set()).add(int(child.rsplit("-", 1)[1]))
            self._hold(parent)
            child, parent = parent, parent_of(parent)
        if self.state.budgets is not None:
            self.state.budgets.restore(child, spent)

    def _hold(self, session: str) -> None:
        state = self.state
        if state.holds.get(session) is not None:
            return
        parent = parent_of(session)
        call_id = int(session.rsplit("-", 1)[1]) if parent is not None else 0
        state.holds.hold(Hold(session, "", parent=parent, call_id=call_id))
        state.idle.busy(session)
        if parent is not None:
            self.paused.add(session)  # its child timer starts once nothing of it waits
        elif state.budgets is not None:
            state.budgets.open(session)

    def child_answered(
        self, parent: str, answer: SubagentCompleted | SubagentFailed
    ) -> Effects | None:
        """A child's outcome for ``parent``'s call: None if ``parent``'s turn runs (it hears
        it as any answer); otherwise ``parent`` waited since the start, and the outcome
        resumes its turn (or goes into the resume of a turn being opened)."""
        waiting = self.children.get(parent)
        if waiting is None or answer.call_id not in waiting:
            return None
        waiting.discard(answer.call_id)
        if not waiting:
            del self.children[parent]
        state = self.state
        hold = state.holds.get(parent)
        if hold is None or parent in state.live:
            return None
        if hold.resume is not None:
            children = tuple(c for c in hold.resume.children if c != answer.call_id)
            answers = (*hold.resume.answers, answer)
            hold.resume = msgspec.structs.replace(hold.resume, children=children, answers=answers)
            return []
        return self._resume(parent, [], answer)

    def _resume(
        self,
        session: str,
        decisions: list[ApprovalDecision],
        answer: SubagentCompleted | SubagentFailed | None = None,
    ) -> Effects:
        """Open ``session`` and continue its turn with ``decisions`` (or a child's
        ``answer``); its other calls keep waiting, now for the resumed turn."""
        hold = self.state.holds.get(session)
        if hold is None:
            return []
        still = self.book.of(session)
        for waiting in still:
            waiting.live = True
        ids = tuple(w.entry.request.call_id for w in still)
        children = tuple(sorted(self.children.get(session, ())))
        answers = () if answer is None else (answer,)
        hold.resume = Resume(tuple(decisions), ids, children, answers)
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
