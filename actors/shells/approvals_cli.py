"""``loopd approvals``, ``loopd approve`` and ``loopd deny``: a person decides from a shell.

They work on the store, directly, on a home no runtime holds (the CLI takes the home's lock for
the moment it writes, so no runtime starts meanwhile): the decision is recorded with the waiting
call, and the turn resumes at the next ``Runtime.start`` on that home. A runtime that holds the
home is decided through (``Runtime.approve`` / ``deny``, the REPL's ``approve(...)``); on a
shared store (PostgreSQL) a session another process runs now is refused (``HELD_ELSEWHERE``).
A decision for a call that is not waiting prints the ``ApprovalRefused`` detail and exits 1;
so does one the next start would not carry out: a background child's call (it drops it), or a
call past its stored deadline (the deadline is binding: it declines it for its timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from actors.core.approvals import (
    NOT_WAITING,
    check_call_id,
    decision_text,
    dropped_at_start,
    past_deadline,
    shell_refusal,
    stored_timeout_s,
    timeout_reason,
)
from actors.core.config import Config
from actors.shells.render import approvals_table
from actors.stores.base import StoreError
from actors.stores.lock import HomeLock
from actors.stores.open import open_store
from messages import ApprovalRefused, StoredApproval, check_session_id

__all__ = ["add_commands", "cmd_approvals", "cmd_approve", "cmd_deny"]

ConfigOf = Callable[[argparse.Namespace], Config]

HELD_ELSEWHERE = (
    "session {session} is run by another loopd process now (it holds the session's lock in "
    "the shared store): decide through that runtime (Runtime.approve, its REPL, or the "
    "service it serves); see docs/runbook.md#approval-held-elsewhere"
)
"""What ``loopd approve`` / ``deny`` print (exit 2) when, on a shared store, another process's
runtime runs the session: a decision written behind it would never reach its turn."""

SHARED_STORE_CAVEAT = (
    " (on a shared store, a runtime that holds the session without its actor, waiting since "
    "its start or passivated, does not see this decision: one made through that runtime, or "
    "its timeout, comes first; see docs/runbook.md#approval-held-elsewhere)"
)
"""Added to what ``loopd approve`` / ``deny`` print on a shared store (PostgreSQL): such a
runtime holds no lock the CLI could see, so the decision recorded here is carried out only if
that runtime stops before it settles the call itself."""


def cmd_approvals(args: argparse.Namespace, config: Config) -> int:
    """List the calls waiting for a person, oldest first, the untrusted flag shown: only those
    a decision here is carried out for. Below the table: each call past its deadline (the
    next start declines it for its timeout), and how many background children's calls were
    left out (the next start drops them)."""
    store = open_store(config)
    try:
        waiting = [e for e in store.approvals() if e.approved is None]
    finally:
        store.close()
    now = datetime.now(UTC)
    kept = [e for e in waiting if not dropped_at_start(e)]
    print(approvals_table(tuple(e.request for e in kept if not past_deadline(e, now))))
    for e in (e for e in kept if past_deadline(e, now)):
        r, reason = e.request, timeout_reason(stored_timeout_s(e))
        print(
            f"past its deadline: call {r.call_id} of session {r.session} ({r.tool}); the "
            f"next start declines it: {reason}"
        )
    cut_off = len(waiting) - len(kept)
    if cut_off:
        calls = "call" if cut_off == 1 else "calls"
        print(
            f"not listed: {cut_off} {calls} of background subagents a stop cut off (the next "
            "start drops them; see docs/runbook.md#approval-of-a-cut-off-background-child)"
        )
    return 0


def cmd_approve(args: argparse.Namespace, config: Config) -> int:
    """Approve a waiting call in the store."""
    return _settle(config, args.session, args.call_id, True, args.note or "")


def cmd_deny(args: argparse.Namespace, config: Config) -> int:
    """Decline a waiting call in the store, with a reason the model reads."""
    return _settle(config, args.session, args.call_id, False, args.reason)


@contextlib.contextmanager
def _no_runtime(config: Config) -> Iterator[None]:
    """Hold the home so no runtime starts while the CLI writes (``HomeInUse`` if one runs)."""
    if config.store.url is not None:  # a shared store: each write is atomic by itself
        yield
        return
    config.home_path.mkdir(parents=True, exist_ok=True)
    lock = HomeLock.acquire(config.home_path)
    try:
        yield
    finally:
        lock.release()


def _settle(config: Config, session: str, call_id: int, approved: bool, reason: str) -> int:
    check_session_id(session)
    with _no_runtime(config):
        store = open_store(config)
        try:
            # The home's lock (SQLite) keeps the row as read until the decision is written.
            row = _row(store.approvals(), session, call_id)
            refused = shell_refusal(row, session, call_id, datetime.now(UTC))
            done = refused is None and store.settle_approval(session, call_id, approved, reason)
        except StoreError as exc:
            if not exc.held_elsewhere:
                raise
            print(f"loopd: {HELD_ELSEWHERE.format(session=session)}", file=sys.stderr)
            return 2
        finally:
            store.close()
    if not done:
        # Refused before writing, or the write found the row decided meanwhile (PostgreSQL).
        detail = refused or NOT_WAITING.format(call_id=call_id, session=session)
        print(ApprovalRefused(session, call_id, detail).detail)
        return 1
    word = "approved" if approved else "declined"
    caveat = SHARED_STORE_CAVEAT if config.store.url is not None else ""
    print(f"call {call_id} of session {session} {word}; its turn resumes at the next start{caveat}")
    return 0


def _call_id_arg(raw: str) -> int:
    """The ``CALL_ID`` argument: a whole number from 1 to the largest 64-bit integer
    (argparse prints the error naming it and exits 2 otherwise)."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"{raw[:40]!r} is not a call id: a whole number from 1")
    try:
        return check_call_id(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _text_arg(what: str) -> Callable[[str], str]:
    """The ``--reason`` / ``--note`` argument: valid Unicode text (an argument that is not
    UTF-8 arrives with lone surrogates) of at most ``MAX_DECISION_CHARS`` characters,
    neutralised; argparse prints the error naming it and exits 2 otherwise."""

    def parse(raw: str) -> str:
        try:
            return decision_text(raw, what)
        except (TypeError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what.removeprefix("the ")  # argparse names the type in some errors
    return parse


def _row(entries: list[StoredApproval], session: str, call_id: int) -> StoredApproval | None:
    """The stored row of ``session``'s call ``call_id``, if any."""
    found = (e for e in entries if (e.request.session, e.request.call_id) == (session, call_id))
    return next(found, None)


def add_commands(
    sub: Any, common: Callable[[argparse.ArgumentParser], None], config_of: ConfigOf
) -> None:
    """Add the three commands to the ``loopd`` parser's subcommands ``sub``."""

    def runs(fn: Callable[[argparse.Namespace, Config], int]) -> Callable[..., int]:
        return lambda args: fn(args, config_of(args))

    listing = sub.add_parser("approvals", help="the calls waiting for a person's decision")
    common(listing)
    listing.set_defaults(fn=runs(cmd_approvals))
    for name, fn, what in (
        ("approve", cmd_approve, "say yes to a waiting call"),
        ("deny", cmd_deny, "say no to a waiting call"),
    ):
        p = sub.add_parser(name, help=what + " (on a home no runtime holds)")
        common(p)
        p.add_argument("session", help="the session whose call waits")
        p.add_argument("call_id", type=_call_id_arg, help="the call's id")
        if name == "approve":
            p.add_argument(
                "--note", type=_text_arg("the note"), help="a note kept with the decision"
            )
        else:
            p.add_argument(
                "--reason",
                type=_text_arg("the reason"),
                required=True,
                help="why; the model reads it",
            )
        p.set_defaults(fn=runs(fn))
