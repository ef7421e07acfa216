"""``loop.token_budget``: what each top-level turn's family has spent, counted by one owner.

The Context keeps a :class:`Budgets`: it opens a family when a top-level turn takes its hold,
adds every answer's tokens that a session of the family reports, and checks each model request
of the family before forwarding it. A request is refused once the spent total has reached the
budget; requests already in flight finish and are counted. One owner, so the count is exact
however many children run at once.
"""

from __future__ import annotations

from actors.core.dispatch import depth_of
from messages import Usage

__all__ = ["Budgets", "family_of", "parent_of"]


def family_of(session: str) -> str:
    """The top-level session whose turn ``session`` belongs to: ``sub-sub-mm-1-2`` is ``mm``."""
    depth = depth_of(session)
    if depth == 0:
        return session
    return session[4 * depth :].rsplit("-", depth)[0]


def parent_of(session: str) -> str | None:
    """The parent of child ``session`` by the id rule (``sub-<parent>-<n>``); None at the top."""
    if depth_of(session) == 0:
        return None
    return session[4:].rsplit("-", 1)[0]


class Budgets:
    """Spent tokens (prompt plus completion) per running top-level turn, against ``limit``.

    Each top-level turn opens an account; every session of its family spends on it. A
    background child (``[subagents] background``) is attached (:meth:`attach`) to the account of the
    turn that spawned it, and keeps it (its own children too) until it is closed, also after
    that turn ended and the parent's next turn opened an account of its own.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._spent: dict[int, int] = {}  # account: tokens spent
        self._holders: dict[int, int] = {}  # account: sessions holding it open
        self._account: dict[str, int] = {}  # top-level session or background child: account
        self._next = 0

    def open(self, session: str) -> None:
        """A top-level turn of ``session`` begins: its family starts at zero."""
        self._drop(session)
        self._next += 1
        self._account[session] = self._next
        self._spent[self._next] = 0
        self._holders[self._next] = 1

    def restore(self, session: str, spent: int) -> None:
        """The top-level turn of ``session`` resumes after a restart: its family had spent
        ``spent`` before (nothing if it has no account)."""
        account = self._account.get(session)
        if account is not None:
            self._spent[account] = max(self._spent[account], spent)

    def attach(self, child: str, parent: str) -> None:
        """Background ``child`` spends on the account ``parent`` spends on now, until
        closed (nothing if ``parent`` has none)."""
        account = self._find(parent)
        if account is None:
            return
        self._drop(child)
        self._account[child] = account
        self._holders[account] += 1

    def close(self, session: str) -> None:
        """The top-level turn of ``session`` (or background child ``session``) ended; once no
        one holds its account, later reports on it are not kept."""
        self._drop(session)

    def _drop(self, session: str) -> None:
        account = self._account.pop(session, None)
        if account is None:
            return
        self._holders[account] -= 1
        if self._holders[account] == 0:
            del self._holders[account], self._spent[account]

    def _find(self, session: str) -> int | None:
        """The account ``session`` spends on: its own, or its nearest ancestor's."""
        at: str | None = session
        while at is not None:
            account = self._account.get(at)
            if account is not None:
                return account
            at = parent_of(at)
        return None

    def spend(self, session: str, usage: Usage) -> None:
        """Count what one answer to ``session`` (any member of a family) cost."""
        account = self._find(session)
        if account is not None:
            self._spent[account] += usage.prompt_tokens + usage.completion_tokens

    def spent(self, session: str) -> int:
        """What the family of ``session`` has spent in its running top-level turn (0: none)."""
        account = self._find(session)
        return 0 if account is None else self._spent[account]

    def refusal(self, session: str) -> str | None:
        """Why a model request of ``session`` may not be sent, or None if it may."""
        spent = self.spent(session)
        if spent < self.limit:
            return None
        family = family_of(session)
        return (
            f"the turn of {family} and its children spent {spent} tokens; "
            f"loop.token_budget is {self.limit}"
        )
