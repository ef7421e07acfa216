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

__all__ = ["Budgets", "family_of"]


def family_of(session: str) -> str:
    """The top-level session whose turn ``session`` belongs to: ``sub-sub-mm-1-2`` is ``mm``."""
    depth = depth_of(session)
    if depth == 0:
        return session
    return session[4 * depth :].rsplit("-", depth)[0]


class Budgets:
    """Spent tokens (prompt plus completion) per running top-level turn, against ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._spent: dict[str, int] = {}

    def open(self, session: str) -> None:
        """A top-level turn of ``session`` begins: its family starts at zero."""
        self._spent[session] = 0

    def close(self, session: str) -> None:
        """The top-level turn of ``session`` ended; later reports of its family are not kept."""
        self._spent.pop(session, None)

    def spend(self, session: str, usage: Usage) -> None:
        """Count what one answer to ``session`` (any member of a family) cost."""
        family = family_of(session)
        if family in self._spent:
            self._spent[family] += usage.prompt_tokens + usage.completion_tokens

    def spent(self, session: str) -> int:
        """What the family of ``session`` has spent in its running top-level turn (0: none)."""
        return self._spent.get(family_of(session), 0)

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
