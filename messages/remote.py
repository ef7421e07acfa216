"""Remote children: the messages of a child that is a proxy of one task of a remote A2A agent.

A ``subagent`` call with a profile that has ``a2a_url`` runs its child as a proxy session. The
proxy stores its :class:`RemoteTaskRow` (:class:`SaveRemoteTask`) before it asks the A2A service
to send the task (:class:`RemoteSend`); the service tells it the remote task's id once it has
one (:class:`RemoteTaskStarted`, stored in the row too) and the outcome
(:class:`RemoteTaskEnded`). The row goes when the child ends (:class:`DropRemoteTask`); a row
left at the next start means a crash cut the child off, and its remote task is cancelled.
"""

from __future__ import annotations

from messages.base import Message
from messages.ids import SessionId

__all__ = [
    "DropRemoteTask",
    "ListRemoteTasks",
    "RemoteCancel",
    "RemoteSend",
    "RemoteTaskEnded",
    "RemoteTaskRow",
    "RemoteTaskSaved",
    "RemoteTaskStarted",
    "SaveRemoteTask",
]


class RemoteTaskRow(Message, frozen=True):
    """Remote child ``child`` of ``parent``, as the store keeps it while the child runs.

    ``context_id`` is the A2A ``contextId`` its message is sent with (chosen here, so the task
    can be found even before its id is known); ``task_id`` the remote task's id once the
    remote has given it ('' until then).
    """

    child: SessionId
    parent: SessionId
    url: str
    context_id: str
    task_id: str = ""


class SaveRemoteTask(Message, frozen=True):
    """Store ``row`` (insert, or replace the row of the same child); answered
    :class:`RemoteTaskSaved` at ``reply_to``. ``session`` is the child."""

    session: SessionId
    row: RemoteTaskRow
    reply_to: str
    request_id: int = 0


class DropRemoteTask(Message, frozen=True):
    """Forget remote child ``session``'s row (it ended); answered :class:`RemoteTaskSaved`."""

    session: SessionId
    reply_to: str
    request_id: int = 0


class RemoteTaskSaved(Message, frozen=True):
    """The store wrote (or dropped) ``session``'s row; ``error`` is why not ('' if it did)."""

    session: SessionId
    request_id: int
    error: str = ""


class ListRemoteTasks(Message, frozen=True):
    """Asked of the store at the start: every remote task row (children a crash cut off)."""


class RemoteSend(Message, frozen=True):
    """Send ``text`` as one new task to the remote agent at ``url`` (profile ``agent``), in
    A2A context ``context_id``; tell ``reply_to`` :class:`RemoteTaskStarted` once the task has
    an id, and :class:`RemoteTaskEnded` when it ends. ``session`` is the child."""

    session: SessionId
    parent: SessionId
    agent: str
    url: str
    text: str
    context_id: str
    reply_to: str


class RemoteCancel(Message, frozen=True):
    """Child ``session`` no longer waits: stop following its task and cancel it remotely."""

    session: SessionId


class RemoteTaskStarted(Message, frozen=True):
    """The remote agent gave ``session``'s task the id ``task_id``."""

    session: SessionId
    task_id: str


class RemoteTaskEnded(Message, frozen=True):
    """``session``'s remote task ended: ``completed`` with ``text`` (its artifacts' text), or
    failed with ``detail`` naming the URL and what went wrong."""

    session: SessionId
    completed: bool
    text: str = ""
    detail: str = ""
