"""Identifiers: session ids and call ids, and the one rule that checks a session id."""

from __future__ import annotations

import re
from typing import Annotated

from msgspec import Meta

__all__ = [
    "CHILD_PREFIX",
    "CallId",
    "SessionId",
    "check_session_id",
    "check_text",
    "check_top_level_session",
    "family_root",
]

SessionId = Annotated[
    str,
    Meta(
        description=(
            "1 to 64 bytes of ASCII letters, digits, '.', '_' and '-', starting with a letter "
            "or digit. Checked by check_session_id wherever a message carries one."
        )
    ),
]
"""A session's id; also its address, its store key and a safe file name."""

CallId = Annotated[int, Meta(ge=1, description="A tool call's number, per session, from 1.")]
"""A tool call's number: counted per session from 1 and never reused."""

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# Ids found valid lately: every message checks its ids when built, a turn builds dozens, and a
# set lookup is cheaper than the pattern. Cleared when full, so it stays small.
_SEEN: set[str] = set()
_SEEN_MAX = 65_536


def check_session_id(text: object) -> str:
    """Return ``text`` if it is a valid session id; raise ``ValueError`` naming it otherwise.

    Never truncates or rewrites: an id is either used exactly as given or refused.
    """
    if type(text) is str and text in _SEEN:
        return text
    if not isinstance(text, str):
        raise ValueError(f"session id must be a string, not {type(text).__name__}: {text!r}")
    if _SESSION_ID.fullmatch(text) is None:
        if not text:
            why = "it is empty"
        elif len(text.encode("utf-8", "surrogatepass")) > 64:
            why = "it is longer than 64 bytes"
        elif not (text[0].isascii() and text[0].isalnum()):
            why = "it must start with an ASCII letter or digit"
        else:
            why = "only ASCII letters, digits, '.', '_' and '-' are allowed"
        raise ValueError(f"invalid session id {text!r}: {why}")
    if type(text) is str:  # not a subclass, whose equality could say anything
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN.add(text)
    return text


CHILD_PREFIX = "sub-"
"""How every child's id begins: ``sub-<parent>-<n>``."""


def check_top_level_session(text: object) -> str:
    """Return ``text`` if it is a valid id for a top-level turn; raise ``ValueError`` otherwise.

    On top of :func:`check_session_id`: an id that begins with ``sub-`` is a child's, and
    children are opened only by their parents (a top-level turn on it could pre-seed or take
    over a child's transcript).
    """
    session = check_session_id(text)
    if session.startswith(CHILD_PREFIX):
        raise ValueError(
            f"session id {session!r} begins with {CHILD_PREFIX!r}: that is a child's id, and "
            "children are opened only by their parents"
        )
    return session


def check_text(value: object, what: str, *, optional: bool = False) -> None:
    """Refuse ``value`` unless it is text loopd can store and send.

    Raises ``TypeError`` naming ``what`` unless ``value`` is a ``str`` (or None, if
    ``optional``), and ``ValueError`` if it holds a lone surrogate: that is not valid Unicode
    text (it cannot be encoded as UTF-8, so neither the store nor the wire could take it).
    """
    if value is None and optional:
        return
    if not isinstance(value, str):
        kind = "a str or None" if optional else "a str"
        raise TypeError(f"{what} must be {kind}, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} is not valid Unicode text: a lone surrogate at index {exc.start}"
        ) from None


_CHILD = re.compile(r"sub-(.+)-[0-9]+", re.ASCII)


def family_root(session: str) -> str:
    """The top-level id of ``session``'s family: ``sub-<parent>-<n>`` unwrapped to the root.

    ``sub-sub-mm-thread-1-2`` is ``mm-thread``'s grandchild, so its root is ``mm-thread``. Any
    other id is its own root.
    """
    while (match := _CHILD.fullmatch(session)) is not None:
        session = match[1]
    return session
