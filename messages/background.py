"""Background subagents: the messages of a child that runs while its parent goes on.

A ``subagent`` call with ``background: true`` resolves at once; the child's outcome reaches the
parent later as a :class:`BackgroundReport`. What the Context must not lose (a background child
running, a report not yet delivered) is a :class:`BackgroundRow` in the store, written before
anyone is told (:class:`SaveBackground`), read back at the next start (:class:`LoadBackground`),
and deleted in the transaction that stores the report in the parent's transcript
(``AppendMessages.reports``).
"""

from __future__ import annotations

from messages.base import Message
from messages.ids import CallId, SessionId

__all__ = [
    "BackgroundLoaded",
    "BackgroundReport",
    "BackgroundRow",
    "BackgroundSaved",
    "DropBackground",
    "FamilyIdle",
    "LoadBackground",
    "SaveBackground",
    "WaitFamily",
]


class BackgroundRow(Message, frozen=True):
    """A background ``child`` of ``parent`` (its call ``call_id``), as the store keeps it.

    ``report`` is None while the child runs; then the text its parent is told
    (``<child> completed\\n<summary>`` or ``<child> failed``), with the child's ``untrusted``
    flag, until the parent's transcript holds it.
    """

    child: SessionId
    parent: SessionId
    call_id: CallId
    report: str | None = None
    untrusted: bool = False


class SaveBackground(Message, frozen=True):
    """Store ``row`` (insert, or replace the row of the same child); answered
    :class:`BackgroundSaved` at ``reply_to``. ``session`` is the child."""

    session: SessionId
    row: BackgroundRow
    reply_to: str
    request_id: int = 0


class DropBackground(Message, frozen=True):
    """Forget background child ``session``'s row (it was cancelled: nothing is reported);
    answered :class:`BackgroundSaved` at ``reply_to``."""

    session: SessionId
    reply_to: str
    request_id: int = 0


class BackgroundSaved(Message, frozen=True):
    """The store's answer to :class:`SaveBackground` or :class:`DropBackground`; ``error``
    says why it failed (empty: it is durable)."""

    session: SessionId
    request_id: int = 0
    error: str = ""


class LoadBackground(Message, frozen=True):
    """Read every stored background row (at the Context's start); answered
    :class:`BackgroundLoaded` at ``reply_to``."""

    reply_to: str
    request_id: int = 0
    session: str = "*"
    """Names the request in the store's errors (it concerns no one session)."""


class BackgroundLoaded(Message, frozen=True):
    """Every stored background row, oldest first; ``error`` if none could be
    read."""

    rows: tuple[BackgroundRow, ...] = ()
    request_id: int = 0
    error: str = ""


class BackgroundReport(Message, frozen=True):
    """The Context tells ``parent``'s running turn the outcome of its background ``child``:
    ``text`` goes into the parent's transcript as a user message named ``subagent`` before its
    next model request (a turn that makes none leaves it to the Context, which runs it as a
    new turn)."""

    parent: SessionId
    child: SessionId
    text: str
    untrusted: bool = False


class WaitFamily(Message, frozen=True):
    """Answer :class:`FamilyIdle` at ``reply_to`` once ``session`` and every descendant are idle
    and no background report for any of them waits (``Runtime.wait_family``)."""

    session: SessionId
    reply_to: str


class FamilyIdle(Message, frozen=True):
    """The answer to :class:`WaitFamily`: ``session``'s family is idle."""

    session: SessionId
