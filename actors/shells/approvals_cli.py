"""``loopd approvals``, ``loopd approve`` and ``loopd deny``: a person decides from a shell.

They work on the store, directly, on a home no runtime holds (the CLI takes the home's lock for
the moment it writes, so no runtime starts meanwhile): the decision is recorded with the waiting
call, and the turn resumes at the next ``Runtime.start`` on that home. A runtime that holds the
home is decided through (``Runtime.approve`` / ``deny``, the REPL's ``approve(...)``); on a
shared store (PostgreSQL) a session another process runs now is refused (``HELD_ELSEWHERE``).
A decision for a call that is not waiting prints the ``ApprovalRefused`` detail and exits 1;
so does one the next start would not carry out: a background child's call (it drops it), or a
call past its stored deadline (the deadline is binding: it declines it for its timeout).

``loopd approvals --json`` prints one line per waiting call, the ``ApprovalRequested`` as the
service's ``GET /v1/approvals`` lists it. ``loopd approvals --wait [--timeout S]`` blocks until at
least one call waits, then prints the list (exit 124 when ``--timeout`` runs out first). On a
home no service serves it reads the store every :data:`POLL_S` seconds: a runtime in another
process tells nobody outside when it stores a waiting call, and reading the small approvals
table (one indexed query, read-only) costs well under a millisecond.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.core.config import Config
    from actors.stores.base import StoreBackend
    from messages import ApprovalRequested, StoredApproval

# The rest is imported where it is used: building the ``loopd`` parser imports none of it.

__all__ = [
    "POLL_S",
    "add_commands",
    "cmd_approvals",
    "cmd_approve",
    "cmd_deny",
    "print_requests",
]

ConfigOf = Callable[[argparse.Namespace], "Config"]
Seconds = Callable[[str], float]

POLL_S = 0.2
"""How often ``loopd approvals --wait`` reads the store of a home no service serves."""

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
    left out (the next start drops them). ``--json``: one ``ApprovalRequested`` a line (the
    notes on stderr); ``--wait``: first wait until a call waits (see :func:`_wait_local`)."""
    if getattr(args, "wait", False):
        return _wait_local(args, config)
    from actors.stores.open import open_store

    store = open_store(config)
    try:
        rows = store.approvals()
    finally:
        store.close()
    listed, notes = _sort(rows)
    print_requests(listed, json_lines=getattr(args, "json", False), notes=notes)
    return 0


def _sort(rows: Sequence[StoredApproval]) -> tuple[tuple[ApprovalRequested, ...], list[str]]:
    """The waiting calls a decision here is carried out for, and the notes on the others."""
    from actors.core.approvals import (
        dropped_at_start,
        past_deadline,
        stored_timeout_s,
        timeout_reason,
    )

    now = datetime.now(UTC)
    waiting = [e for e in rows if e.approved is None]
    kept = [e for e in waiting if not dropped_at_start(e)]
    notes = []
    for e in (e for e in kept if past_deadline(e, now)):
        r, reason = e.request, timeout_reason(stored_timeout_s(e))
        notes.append(
            f"past its deadline: call {r.call_id} of session {r.session} ({r.tool}); the "
            f"next start declines it: {reason}"
        )
    cut_off = len(waiting) - len(kept)
    if cut_off:
        calls = "call" if cut_off == 1 else "calls"
        notes.append(
            f"not listed: {cut_off} {calls} of background subagents a stop cut off (the next "
            "start drops them; see docs/runbook.md#approval-of-a-cut-off-background-child)"
        )
    return tuple(e.request for e in kept if not past_deadline(e, now)), notes


def print_requests(
    requests: Sequence[ApprovalRequested | dict[str, Any]],
    *,
    json_lines: bool,
    notes: Sequence[str] = (),
) -> None:
    """``loopd approvals``' output: the table and its notes, or with ``json_lines`` one JSON
    object a call (a service's item as it came) and the notes on stderr."""
    if json_lines:
        import msgspec

        for r in requests:
            print(msgspec.json.encode(r).decode())
        for note in notes:
            print(note, file=sys.stderr)
        return
    from actors.shells.render import approvals_table

    shown = tuple(_request(r) for r in requests)
    print(approvals_table(shown))
    for note in notes:
        print(note)


def _request(item: ApprovalRequested | dict[str, Any]) -> ApprovalRequested:
    """A service's list item as the ``ApprovalRequested`` the table shows (other keys left)."""
    if not isinstance(item, dict):
        return item
    import msgspec

    from messages import ApprovalRequested

    found: dict[str, Any] = item.get("request", item)  # a stored approval holds its request
    fields = {*ApprovalRequested.__struct_fields__, "type"}
    kept = {k: v for k, v in found.items() if k in fields}
    request: ApprovalRequested = msgspec.convert(kept, ApprovalRequested)
    return request


def _wait_local(args: argparse.Namespace, config: Config) -> int:
    """``loopd approvals --wait`` on a home no service serves: read the store every
    :data:`POLL_S` s (read-only; a store not made yet is waited for) until a call waits, then
    print the list; exit 124 when ``--timeout`` runs out first."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    with _watched(config) as read:
        while True:
            rows = read()
            listed, notes = _sort(rows)
            if listed:
                print_requests(listed, json_lines=args.json, notes=notes)
                return 0
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return wait_timed_out(args.timeout)
            time.sleep(POLL_S if left is None else min(POLL_S, left))


def wait_timed_out(timeout: float) -> int:
    """``--wait --timeout`` ran out: say so on stderr; the exit status (124)."""
    from actors.shells.flags import EXIT_TIMEOUT

    print(f"loopd: no call waited for a decision within {timeout:g} s (--timeout)", file=sys.stderr)
    return EXIT_TIMEOUT


@contextlib.contextmanager
def _watched(config: Config) -> Iterator[Callable[[], list[StoredApproval]]]:
    """A function reading the home's stored approvals, for as long as the block runs: the
    shared store's, or the SQLite file's opened read-only once it exists (none until then)."""
    from actors.stores.base import StoreError

    if config.store.url is not None:
        from actors.stores.open import open_store

        shared = open_store(config)
        try:
            yield shared.approvals
        finally:
            shared.close()
        return
    from actors.stores.reader import StoreReader
    from actors.stores.sqlite import DB_NAME

    home = config.home_path
    if home.exists() and not home.is_dir():
        raise StoreError(None, f"the home {home} is not a folder")
    path = home / DB_NAME
    reader: list[StoreBackend] = []

    def read() -> list[StoredApproval]:
        if not reader:
            if not path.is_file():
                return []
            try:
                reader.append(StoreReader(path))
            except StoreError:  # made this instant: its schema is not written yet
                return []
        return reader[0].approvals()

    try:
        yield read
    finally:
        for opened in reader:
            opened.close()


def cmd_approve(args: argparse.Namespace, config: Config) -> int:
    """Approve a waiting call in the store."""
    return _settle(config, args.session, args.call_id, True, args.note or "")


def cmd_deny(args: argparse.Namespace, config: Config) -> int:
    """Decline a waiting call in the store, with a reason the model reads."""
    return _settle(config, args.session, args.call_id, False, args.reason)


@contextlib.contextmanager
def _no_runtime(config: Config) -> Iterator[None]:
    """Hold the home so no runtime starts while the CLI writes (``HomeInUse`` if one runs)."""
    from actors.stores.lock import HomeLock

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
    from actors.core.approvals import NOT_WAITING, shell_refusal
    from actors.stores.base import StoreError
    from actors.stores.open import open_store
    from messages import ApprovalRefused, check_session_id

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
    from actors.core.approvals import check_call_id

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
        from actors.core.approvals import decision_text

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
    sub: Any,
    common: Callable[[argparse.ArgumentParser], None],
    config_of: ConfigOf,
    seconds: Seconds = float,
) -> None:
    """Add the three commands to the ``loopd`` parser's subcommands ``sub`` (``seconds``
    checks ``--timeout``)."""

    def runs(fn: Callable[[argparse.Namespace, Config], int]) -> Callable[..., int]:
        return lambda args: fn(args, config_of(args))

    listing = sub.add_parser("approvals", help="the calls waiting for a person's decision")
    common(listing)
    listing.add_argument("--json", action="store_true", help="one JSON object per waiting call")
    listing.add_argument(
        "--wait", action="store_true", help="block until at least one call waits, then list"
    )
    listing.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        help="with --wait: seconds to wait (> 0); then loopd exits 124",
    )
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
