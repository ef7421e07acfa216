"""The remote session actor: a child that is a proxy of one task of a remote A2A agent.

A ``subagent`` call whose profile has ``a2a_url`` gets this actor in place of a
:class:`~actors.sessions.session.SessionActor`. To the Context it is a child like any other: the
same id, hold, cancel tree, ``loop.child_timeout_s`` and outcome (``SessionTurnEnded``, or
``SessionCrashed`` if it stops under its turn). Its turn:

1. store the child's record with its first message (the ``CreateChild`` of its ``RunTurn``);
2. ask the A2A service to send the task (:class:`~messages.remote.RemoteSend`); the service
   stores the remote task's row before it sends;
3. on :class:`~messages.remote.RemoteTaskEnded`, store the answer (or the reason it failed) as
   the child's assistant message, then end the turn: completed with the remote's text (its
   parent's session untrusted unless the profile says ``trusted``), or failed
   ``remote_error`` with a detail naming the URL and what went wrong.

A ``Cancel`` (an ancestor's cancel, the child's timeout, the runtime's stop) tells the service
to cancel the remote task and ends the turn at once. The actor never waits on the network.
"""

from __future__ import annotations

import logging
import uuid
from types import TracebackType
from typing import Any

import msgspec

from actors.core.config import AgentConfig
from actors.core.remote import remote_context_id, remote_task_text
from actors.dispatcher import DispatchedActor
from actors.dispatcher.directory import A2A, CONTEXT, EVENTS, STORE, session_address
from actors.sessions.session import SessionEnv
from messages import (
    Appended,
    AppendMessages,
    Cancel,
    ChatMessage,
    FailReason,
    Inspect,
    RunTurn,
    SessionCrashed,
    SessionLoaded,
    SessionRecord,
    SessionStopped,
    SessionTurnEnded,
    StoreFailed,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    TurnOutcome,
    TurnStarted,
)
from messages.remote import RemoteCancel, RemoteSend, RemoteTaskEnded, RemoteTaskStarted

__all__ = ["RemoteSessionActor", "is_remote"]

log = logging.getLogger(__name__)

_CREATE = 1  # the request id of the child's first write
_ANSWER = 2  # the request id of its answer's write


def is_remote(profile: AgentConfig) -> bool:
    """True for a profile whose sessions are proxies of a remote A2A agent."""
    return profile.a2a_url is not None


class RemoteSessionActor(DispatchedActor):
    """One remote child: a proxy of one remote task, for the Context a session like another."""

    def __init__(self, record: SessionRecord, env: SessionEnv, incarnation: int = 0) -> None:
        super().__init__(env.dispatcher)
        self.record = record
        self.env = env
        self.incarnation = incarnation
        self.address = session_address(record.id)
        self.profile = env.agent(record.agent).profile
        self.url = self.profile.a2a_url or ""
        self.running = False  # a turn runs: a stop under it is a crash the Context hears of
        self.sent = False  # the service follows a remote task for this turn
        self.text = ""
        self.outcome: TurnOutcome | None = None  # how the turn ends, once its answer is stored
        self.untrusted = record.untrusted
        self.retired = False  # a child that stopped itself after its one turn

    def on_start(self) -> None:
        self.env.directory.register(self.address, self.actor_ref)

    def on_stop(self) -> None:
        self._abandon("the session actor was stopped during its turn")
        self.env.directory.unregister(self.address, self.actor_ref)

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        name = exception_type.__name__ if exception_type else "error"
        self._abandon(f"the session actor failed: {name}: {exception_value}")
        self.env.directory.unregister(self.address, self.actor_ref)

    def _abandon(self, detail: str) -> None:
        tell = self.env.directory.tell
        if self.retired:  # the Context has its outcome already
            return
        if not self.running:
            tell(CONTEXT, SessionStopped(self.record.id, self.incarnation))
            return
        self.running = False
        tell(CONTEXT, SessionCrashed(self.record.id, detail, self.incarnation))
        if self.sent:
            tell(A2A, RemoteCancel(self.record.id))

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Inspect):
            return self.record
        if isinstance(message, RunTurn):
            self._start(message)
        elif not self.running:
            log.debug("%s: no turn for %s", self.record.id, type(message).__name__)
        elif isinstance(message, SessionLoaded) and message.request_id == _CREATE:
            self._send()
        elif isinstance(message, StoreFailed):
            self._end(TurnFailed(self.record.id, FailReason.STORE_ERROR, message.detail))
        elif isinstance(message, RemoteTaskStarted):
            log.debug("%s: remote task %s", self.record.id, message.task_id)
        elif isinstance(message, RemoteTaskEnded):
            self._answered(message)
        elif isinstance(message, Appended) and message.request_id == _ANSWER:
            assert self.outcome is not None
            self._end(self.outcome)
        elif isinstance(message, Cancel):
            if self.sent:
                self.env.directory.tell(A2A, RemoteCancel(self.record.id))
            self._end(TurnFailed(self.record.id, message.reason, message.detail))
        return None

    def _emit(self, event: Any) -> None:
        self.env.tracer.on_event(event, None)
        self.env.directory.tell(EVENTS, event)

    def _start(self, run: RunTurn) -> None:
        s = self.record
        if self.running:
            log.error("%s: a turn is already running; RunTurn ignored", s.id)
            return
        self.running = True
        self._emit(TurnStarted(session=s.id, slot=None, agent=s.agent))
        if s.parent is None or run.create is None:
            detail = (
                f"agent profile {s.agent} is a remote agent ({self.url}): only a subagent call "
                "runs it"
            )
            self._end(TurnFailed(s.id, FailReason.WRONG_AGENT, detail))
            return
        self.text = remote_task_text(run.text)
        create = run.create
        first = msgspec.structs.replace(create, reply_to=self.address, request_id=_CREATE)
        self.env.directory.tell(STORE, first)

    def _send(self) -> None:
        s = self.record
        assert s.parent is not None
        self.sent = True
        send = RemoteSend(
            s.id,
            s.parent,
            s.agent,
            self.url,
            self.text,
            remote_context_id(s.id, uuid.uuid4().hex[:12]),
            self.address,
        )
        self.env.directory.tell(A2A, send)

    def _answered(self, ended: RemoteTaskEnded) -> None:
        """The remote task ended: store the answer (or the reason), then end the turn."""
        s = self.record
        self.sent = False
        if ended.completed:
            self.untrusted = self.untrusted or not self.profile.trusted
            self.outcome = TurnCompleted(s.id, ended.text)
            content = ended.text
        else:
            self.outcome = TurnFailed(s.id, FailReason.REMOTE_ERROR, ended.detail)
            content = f"failed: {ended.detail}"
        answer = ChatMessage(role="assistant", content=content)
        append = AppendMessages(
            s.id, _ANSWER, (answer,), s.turns, s.next_call_id, self.untrusted, self.address
        )
        self.env.directory.tell(STORE, append)

    def _end(self, outcome: TurnOutcome) -> None:
        """End the turn with ``outcome``: the event, the Context's answer; a child retires."""
        s = self.record
        self.running = False
        if isinstance(outcome, TurnCompleted):
            ended = TurnEnded(session=s.id, completed=True)
        else:
            ended = TurnEnded(
                session=s.id, completed=False, reason=outcome.reason, detail=outcome.detail
            )
        self._emit(ended)
        tell = self.env.directory.tell
        tell(CONTEXT, SessionTurnEnded(s.id, outcome, s.turns, self.untrusted))
        if s.parent is not None:
            self.retired = True
            self._stop()
