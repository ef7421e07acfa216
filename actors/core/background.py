"""Background subagents' decisions, with no I/O (``[subagents] background``).

A ``subagent`` call with ``background: true`` resolves at once to ``<child> started in the
background``; the parent's turn goes on and may end first. The child's outcome text reaches the
parent later as a user message named ``subagent``: before the parent's next model request while
a turn of it runs, otherwise as a new top-level turn of the parent once nothing holds it. The
rules kept here:

- at most ``subagents.max_background`` background children of one top-level family run at
  once (:meth:`Background.running_in`);
- every new state is stored before anyone hears of it: a child running (its row, before
  ``started`` is answered), a report (its text, before it is delivered); a report leaves the
  store in the transaction that writes it into the parent's transcript, so it is delivered
  once;
- a report is queued until a turn of its parent stores it; one told to a turn that ended
  without storing it goes back to the queue (:meth:`Background.returned`), never dropped;
- a child cancelled with its parent or an ancestor reports nothing (its row is dropped);
- at the next start, a child that was running reports ``<child> failed`` and a stored report
  is delivered.

:class:`Background` is the state (counts, the queue, what waits on the store);
:class:`BackgroundSpawns` is the part of :class:`~actors.core.context_state.ContextState` that
uses it, a mixin so the Context's state module keeps only small hooks.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec

from actors.core.budget import Budgets, family_of
from actors.core.config import DEFAULT_AGENT, Config
from actors.core.context_effects import ContextEffect, IfGone, Reply, ToSession, ToStore
from actors.core.dispatch import depth_of, descends_from
from actors.core.holds import Hold, HoldTable
from actors.core.spawn import CHILD_BACKGROUND
from actors.core.turn_effects import Emit
from messages import (
    BackgroundLoaded,
    BackgroundReport,
    BackgroundRow,
    BackgroundSaved,
    Cancel,
    DenyReason,
    DropBackground,
    FailReason,
    FamilyIdle,
    LoadBackground,
    RunTurn,
    SaveBackground,
    SubagentFinished,
    SubagentStarted,
    ToolDone,
    ToolResult,
    WaitFamily,
    denial_message,
)

__all__ = [
    "REPORT_SPEAKER",
    "Background",
    "BackgroundSpawns",
    "limit_detail",
    "started_text",
]

Effects = list[ContextEffect]

REPORT_SPEAKER = "subagent"
"""The ``name`` of the user message that carries a background child's outcome."""


def started_text(child: str) -> str:
    """What a background ``subagent`` call resolves to at once."""
    return f"{child} started in the background"


def limit_detail(running: int) -> str:
    """The detail of the LIMIT denial of one background child too many."""
    return f"{running} background subagents are running; wait for one to report"


def failed_text(child: str) -> str:
    """The report of a background child cut off by a stop or a crash."""
    return f"{child} failed"


@dataclass
class _Saving:
    """A store request about a background row, not answered yet."""

    kind: str  # "start": a child to launch; "report": a report to queue; "drop": nothing
    row: BackgroundRow
    finished: SubagentFinished | None = None  # told once the report is stored


class Background:
    """The background children that run, the reports not yet delivered, who waits."""

    def __init__(self, max_background: int) -> None:
        self.max_background = max_background
        self._running: dict[str, str] = {}  # child: its top-level family
        self._counts: dict[str, int] = {}  # family: children running
        self._saving: dict[int, _Saving] = {}
        self._order = itertools.count(1)
        self._queued: dict[str, tuple[int, BackgroundRow]] = {}  # child: (order, report row)
        self._sent: dict[str, tuple[int, BackgroundRow, Hold]] = {}  # told to a running turn
        self.waiters: list[WaitFamily] = []
        self.loading = False
        """The rows the last run left are being read: nothing counts as idle until then."""

    def running_in(self, family: str) -> int:
        """Background children of ``family`` running (or being stored to run)."""
        return self._counts.get(family, 0)

    def is_running(self, child: str) -> bool:
        """True while ``child`` counts as a running background child."""
        return child in self._running

    def begin(self, child: str) -> None:
        """``child`` counts against its family's ``max_background`` from now."""
        family = family_of(child)
        self._running[child] = family
        self._counts[family] = self._counts.get(family, 0) + 1

    def end(self, child: str) -> None:
        """``child`` no longer runs (nothing if it was not counted)."""
        family = self._running.pop(child, None)
        if family is None:
            return
        self._counts[family] -= 1
        if self._counts[family] == 0:
            del self._counts[family]

    def saving(
        self,
        request_id: int,
        kind: str,
        row: BackgroundRow,
        finished: SubagentFinished | None = None,
    ) -> None:
        """Store request ``request_id`` (``kind``) about ``row`` is on its way; ``finished``
        is told once it is stored."""
        self._saving[request_id] = _Saving(kind, row, finished)

    def saved(self, request_id: int) -> _Saving | None:
        """The request ``request_id`` was answered; what it was about."""
        return self._saving.pop(request_id, None)

    def queue(self, row: BackgroundRow, order: int | None = None) -> None:
        """Report ``row`` is stored: it waits for a turn of its parent."""
        self._queued[row.child] = (next(self._order) if order is None else order, row)

    def queued(self, parent: str) -> list[BackgroundRow]:
        """``parent``'s queued reports, oldest first."""
        found = [(n, row) for n, row in self._queued.values() if row.parent == parent]
        return [row for _n, row in sorted(found, key=lambda pair: pair[0])]

    def send(self, row: BackgroundRow, hold: Hold) -> None:
        """Report ``row`` is told to (or starts) ``hold``'s turn."""
        order, _row = self._queued.pop(row.child)
        self._sent[row.child] = (order, row, hold)

    def delivered(self, children: tuple[str, ...]) -> None:
        """A turn sent these reports to the store with its messages: they are delivered."""
        for child in children:
            self._sent.pop(child, None)
            self._queued.pop(child, None)

    def returned(self, hold: Hold) -> bool:
        """``hold``'s turn is over: the reports it was told and did not store wait again;
        True if there were some."""
        back = [child for child, (_n, _row, told) in self._sent.items() if told is hold]
        for child in back:
            order, row, _hold = self._sent.pop(child)
            self.queue(row, order)
        return bool(back)

    def pending(self, session: str) -> bool:
        """True while a report for ``session`` or a descendant is stored, queued or told."""

        def ours(parent: str) -> bool:
            return parent == session or descends_from(parent, session)

        rows = [s.row for s in self._saving.values() if s.kind != "drop"]
        rows += [row for _n, row in self._queued.values()]
        rows += [row for _n, row, _hold in self._sent.values()]
        return any(ours(row.parent) for row in rows)


class BackgroundSpawns:
    """What the Context's state does for background children (mixed into ``ContextState``,
    whose holds, budgets and live actors it uses)."""

    config: Config
    address: str
    holds: HoldTable
    budgets: Budgets | None
    requests: Iterator[int]
    background: Background

    # What ContextState provides.
    def _tell_live(
        self,
        hold: Hold,
        message: RunTurn | Cancel | BackgroundReport,
        *,
        then: tuple[ContextEffect, ...] = (),
        if_gone: IfGone = IfGone.NOTHING,
        otherwise: tuple[ContextEffect, ...] = (),
    ) -> Effects:
        raise NotImplementedError

    def _running(self, hold: Hold) -> bool:
        raise NotImplementedError

    def _launch(self, hold: Hold, started: SubagentStarted) -> Effects:
        raise NotImplementedError

    def _release(self, session: str) -> Effects:
        raise NotImplementedError

    def _hold_turn(self, hold: Hold) -> Effects:
        raise NotImplementedError

    def _family_held(self, session: str) -> tuple[str, ...]:
        return self.holds.family(session)

    def busy_for_job(self, session: str) -> tuple[str, ...]:
        """The held ids that keep a scheduled job off ``session``: it and its descendants,
        but for its background children and theirs (the session does not wait for them)."""
        held = self.holds.family(session)
        background = [s for s in held if (h := self.holds.get(s)) is not None and h.background]
        if not background:
            return held
        return tuple(s for s in held if not any(s == b or descends_from(s, b) for b in background))

    # The spawn: stored first, then answered at once.

    def limit_denial(self, parent: str, background: bool) -> str | None:
        """The LIMIT denial a ``subagent`` call of ``parent`` meets at the Context now, or
        None: ``loop.max_children_total`` children run, or (``background``) see
        :meth:`_background_denial`. Checked at the spawn, and before a person is asked about
        one (a call denied anyway is denied at once, nobody asked)."""
        limit = self.config.loop.max_children_total
        if self.holds.children() >= limit:
            detail = f"the runtime already runs {limit} children (loop.max_children_total)"
            return denial_message(DenyReason.LIMIT, detail)
        return self._background_denial(parent) if background else None

    def _background_denial(self, parent: str) -> str | None:
        """The LIMIT denial of a background call from a child, or past
        ``subagents.max_background``."""
        if depth_of(parent) > 0:  # the session checks first; answer all the same
            return denial_message(DenyReason.LIMIT, CHILD_BACKGROUND)
        running = self.background.running_in(family_of(parent))
        if running < self.background.max_background:
            return None
        return denial_message(DenyReason.LIMIT, limit_detail(running))

    def _store_background(self, hold: Hold) -> Effects:
        """A held background child: store its row before anyone hears of it."""
        assert hold.parent is not None
        self.background.begin(hold.session)
        row = BackgroundRow(hold.session, hold.parent, hold.call_id)
        return self._save(row, "start")

    def _save(
        self, row: BackgroundRow, kind: str, finished: SubagentFinished | None = None
    ) -> Effects:
        request_id = next(self.requests)
        self.background.saving(request_id, kind, row, finished)
        if kind == "drop":
            return [ToStore(DropBackground(row.child, self.address, request_id))]
        return [ToStore(SaveBackground(row.child, row, self.address, request_id))]

    def background_saved(self, msg: BackgroundSaved) -> Effects:
        """The store answered a background row: launch the child, or deliver the report."""
        saving = self.background.saved(msg.request_id)
        if saving is None:
            return []
        row = saving.row
        if saving.kind == "start":
            return self._saved_start(row, msg.error)
        told = saving.finished
        if saving.kind == "report" and not msg.error:
            self.background.queue(row)
            return [*([Emit(told)] if told else []), *self._deliver(row.parent)]
        if told is not None and msg.error:
            # A report the store refused stays where it was (a running row, read at the next
            # start, which reports the child failed): told failed now, as it will be.
            told = msgspec.structs.replace(told, completed=False, reason=FailReason.STORE_ERROR)
        return [Emit(told)] if told is not None else []

    def _saved_start(self, row: BackgroundRow, error: str) -> Effects:
        hold = self.holds.get(row.child)
        if hold is None or hold.answered or hold.parent != row.parent:
            # Cancelled (or the runtime stops) while its row was stored: forget the row.
            return [] if error else self._save(row, "drop")
        if error:
            effects = self._release(hold.session)
            detail = f"could not store the background child: {error}"
            return effects + hold.failure(FailReason.STORE_ERROR, detail, turn_began=False)
        hold.background = True
        if self.budgets is not None:
            self.budgets.attach(hold.session, row.parent)
        started = SubagentStarted(
            session=row.parent,
            call_id=row.call_id,
            child=row.child,
            agent=hold.agent or DEFAULT_AGENT,
            background=True,
        )
        answer = ToolResult(row.call_id, started_text(row.child))
        return [*self._launch(hold, started), ToSession(row.parent, ToolDone(row.parent, answer))]

    # The outcome: stored, then delivered.

    def report(
        self,
        parent: str,
        child: str,
        call_id: int,
        text: str | None,
        untrusted: bool,
        finished: SubagentFinished | None = None,
    ) -> Effects:
        """A background child ended: store its report (``text``), or drop its row (None: it
        was cancelled with its parent or an ancestor, and reports nothing); ``finished`` is
        told once that is stored."""
        if text is None:
            return self._save(BackgroundRow(child, parent, call_id), "drop", finished)
        row = BackgroundRow(child, parent, call_id, text, untrusted)
        return self._save(row, "report", finished)

    def _deliver(self, parent: str) -> Effects:
        """Deliver ``parent``'s queued reports: into its running turn, or as a new turn of it
        when nothing holds it. A parent whose turn is still opening gets them when it ends."""
        rows = self.background.queued(parent)
        if not rows:
            return []
        hold = self.holds.get(parent)
        if hold is None:
            # A new top-level turn of the parent, its own budget; its first message is the
            # first report, the others follow it.
            first = rows[0]
            turn = Hold(parent, first.report or "", REPORT_SPEAKER, reports=tuple(rows))
            for row in rows:
                self.background.send(row, turn)
            return self._hold_turn(turn)
        if not self._running(hold) or hold.answered:
            return []
        effects: Effects = []
        for row in rows:
            self.background.send(row, hold)
            report = BackgroundReport(parent, row.child, row.report or "", row.untrusted)
            effects += self._tell_live(hold, report)
        return effects

    # The next start.

    def load_background(self) -> Effects:
        """The Context starts: read what the last run left (children cut off, reports); only
        with ``[subagents] background`` on, so a runtime without it asks the store nothing
        more (its stored rows wait until it is on again)."""
        if not self.config.subagents.background:
            return []
        self.background.loading = True
        request_id = next(self.requests)
        return [ToStore(LoadBackground(self.address, request_id))]

    def background_loaded(self, msg: BackgroundLoaded) -> Effects:
        """A child that was running when the last run ended reports ``failed``; a stored
        report is delivered."""
        self.background.loading = False
        effects: Effects = []
        parents: list[str] = []
        for row in msg.rows:
            if self.background.is_running(row.child) or self.holds.get(row.child):
                continue  # this run's own (a spawn raced the load)
            if row.report is None:
                effects += self.report(
                    row.parent, row.child, row.call_id, failed_text(row.child), False
                )
                continue
            self.background.queue(row)
            if row.parent not in parents:
                parents.append(row.parent)
        for parent in parents:
            effects += self._deliver(parent)
        return effects

    # Waiting for a family.

    def family_idle(self, session: str) -> bool:
        """True when ``session`` and every descendant are idle and no report for them is
        pending."""
        if self.background.loading:
            return False
        return not self._family_held(session) and not self.background.pending(session)

    def wait_family(self, msg: WaitFamily) -> Effects:
        """Answer ``msg`` now if the family is idle, else once it is (:meth:`settle`)."""
        if self.family_idle(msg.session):
            return [Reply(msg.reply_to, FamilyIdle(msg.session))]
        self.background.waiters.append(msg)
        return []

    def _stop_waiting(self) -> Effects:
        """The Context stops: every waiter is answered (nothing more will run)."""
        waiters, self.background.waiters = self.background.waiters, []
        return [Reply(msg.reply_to, FamilyIdle(msg.session)) for msg in waiters]

    def settle(self) -> Effects:
        """Answer every waiter whose family has become idle."""
        effects: Effects = []
        waiting = []
        for msg in self.background.waiters:
            if self.family_idle(msg.session):
                effects.append(Reply(msg.reply_to, FamilyIdle(msg.session)))
            else:
                waiting.append(msg)
        self.background.waiters = waiting
        return effects
