"""The dialect of a SQL session store: what differs between SQLite and PostgreSQL.

:class:`Dialect` holds the few parts in which the two databases differ as the session logic
(:class:`~actors.stores.sql.SqlSessionStore`) sees them: the parameter mark, the table names,
how a writing transaction locks, the type names of the session tables, the driver's errors.
Each statement of the session logic is written once, here, and built for a dialect when the
dialect is made. ``sqlite`` and ``postgres`` each make theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.stores.base import StoreError

__all__ = ["Dialect"]

# The session tables, in either database: ``{t}`` is the dialect's table prefix, the other
# fields its type names. The statements below are written with ``?`` placeholders.
_TABLES = (
    """CREATE TABLE {exists}{t}baselines (
    hash TEXT PRIMARY KEY NOT NULL,
    body {blob} NOT NULL
)""",
    """CREATE TABLE {exists}{t}{sessions} (
    id           TEXT PRIMARY KEY NOT NULL,
    baseline     TEXT NOT NULL REFERENCES {t}baselines(hash),
    parent       TEXT,
    slot         INTEGER NOT NULL,
    turns        INTEGER NOT NULL DEFAULT 0,
    next_call_id {bigint} NOT NULL DEFAULT 1 CHECK (next_call_id >= 1),
    untrusted    {flag} NOT NULL DEFAULT {false}{untrusted_check},
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    agent        TEXT NOT NULL DEFAULT 'default',
    running      {flag} NOT NULL DEFAULT {false}{running_check}
)""",
    """CREATE TABLE {exists}{t}messages (
    session   TEXT NOT NULL REFERENCES {t}sessions(id),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    body      {blob} NOT NULL,
    compacted {flag} NOT NULL DEFAULT {false}{compacted_check},
    at        TEXT NOT NULL,
    PRIMARY KEY (session, seq)
)""",
    # The calls waiting for a person (schema 4): ``body`` is the StoredApproval, ``decided``
    # set once a decision is recorded that no running turn has carried out yet.
    """CREATE TABLE {exists}{t}approvals (
    session  TEXT NOT NULL,
    call_id  {bigint} NOT NULL,
    body     {blob} NOT NULL,
    at       TEXT NOT NULL,
    deadline TEXT NOT NULL,
    decided  {flag} NOT NULL DEFAULT {false}{decided_check},
    PRIMARY KEY (session, call_id)
)""",
)

# Background children (``[subagents] background``): one row per child, while it runs
# (``report`` NULL) and then while its report waits for the parent's transcript.
_BACKGROUND = """CREATE TABLE {exists}{t}background (
    child     TEXT PRIMARY KEY NOT NULL,
    parent    TEXT NOT NULL,
    call_id   {bigint} NOT NULL,
    report    TEXT,
    untrusted {flag} NOT NULL DEFAULT {false}{untrusted_check},
    at        TEXT NOT NULL
)"""

# A2A tasks (the service's ``[a2a]`` endpoint, SQLite schema 5, PostgreSQL's 4): one row per
# task, ``body`` the SDK's JSON of the task as last stored, ``context`` its session.
_A2A_TASKS = """CREATE TABLE {exists}{t}a2a_tasks (
    id      TEXT PRIMARY KEY NOT NULL,
    context TEXT NOT NULL,
    state   TEXT NOT NULL,
    body    {blob} NOT NULL,
    at      TEXT NOT NULL
)"""


class Dialect:
    """What differs between two SQL databases, as the session logic sees it.

    ``placeholder`` is the driver's parameter mark (``?``, ``%s``); ``prefix`` goes before every
    table name; ``begin_write`` opens a writing transaction (SQLite takes its write lock up
    front with ``BEGIN IMMEDIATE``) and ``for_update`` locks the row a write reads first
    (PostgreSQL's ``FOR UPDATE``; SQLite's lock is the whole file). ``blob``, ``bigint`` and
    ``flag`` are type names; ``flag_check`` adds ``CHECK (x IN (0, 1))`` to a flag stored as an
    integer. ``error`` is the driver's base error, ``lost`` the errors that mean the connection
    is gone, ``in_transaction`` tells whether a connection is inside a transaction, and
    ``failure`` makes a driver error a :class:`StoreError` naming the session and the action.
    """

    def __init__(
        self,
        *,
        name: str,
        placeholder: str,
        prefix: str,
        begin_write: str,
        for_update: str,
        blob: str,
        bigint: str,
        flag: str,
        flag_check: bool,
        if_not_exists: bool,
        error: type[Exception],
        in_transaction: Callable[[Any], bool],
        failure: Callable[[str | None, str, Exception], StoreError],
        lost: tuple[type[Exception], ...] = (),
    ) -> None:
        """A dialect of these parts; its statements are built once, here."""
        self.name = name
        self.placeholder = placeholder
        self.prefix = prefix
        self.begin_write = begin_write
        self.for_update = for_update
        self.error = error
        self.lost = lost
        self.in_transaction = in_transaction
        self.failure = failure
        self.tables = tuple(
            table.format(
                exists="IF NOT EXISTS " if if_not_exists else "",
                t=prefix,
                sessions="{sessions}",
                blob=blob,
                bigint=bigint,
                flag=flag,
                false="0" if flag_check else "FALSE",
                untrusted_check=" CHECK (untrusted IN (0, 1))" if flag_check else "",
                compacted_check=" CHECK (compacted IN (0, 1))" if flag_check else "",
                decided_check=" CHECK (decided IN (0, 1))" if flag_check else "",
                running_check=" CHECK (running IN (0, 1))" if flag_check else "",
            )
            for table in _TABLES
        )
        """The session tables' ``CREATE TABLE`` statements (baselines, sessions, messages,
        approvals); the sessions table's name
        is left as ``{sessions}`` (a migration builds it under another name first)."""
        self.background_table = _BACKGROUND.format(
            exists="IF NOT EXISTS " if if_not_exists else "",
            t=prefix,
            bigint=bigint,
            flag=flag,
            false="0" if flag_check else "FALSE",
            untrusted_check=" CHECK (untrusted IN (0, 1))" if flag_check else "",
        )
        """The background children's table (SQLite schema version 4, PostgreSQL's 3)."""
        self.a2a_table = _A2A_TASKS.format(
            exists="IF NOT EXISTS " if if_not_exists else "", t=prefix, blob=blob
        )
        """The A2A tasks' table (SQLite schema version 5, PostgreSQL's 4)."""
        self.q = _Statements(self)

    def sql(self, text: str) -> str:
        """``text`` in this dialect: ``{t}`` made the table prefix, ``?`` its placeholder."""
        return text.replace("{t}", self.prefix).replace("?", self.placeholder)

    def __repr__(self) -> str:
        return f"Dialect({self.name!r})"


class _Statements:
    """The session logic's statements in one dialect, built once."""

    def __init__(self, d: Dialect) -> None:
        q = d.sql
        self.parent = q("SELECT parent FROM {t}sessions WHERE id = ?")
        self.exists = q("SELECT 1 FROM {t}sessions WHERE id = ?")
        self.flag_untrusted = q("UPDATE {t}sessions SET untrusted = TRUE WHERE id = ?")
        self.next_call_id = q("SELECT next_call_id FROM {t}sessions WHERE id = ?" + d.for_update)
        self.counters = q(
            "UPDATE {t}sessions SET turns = ?, next_call_id = ?, untrusted = (untrusted OR ?),"
            " updated_at = ? WHERE id = ?"
        )
        self.compact = q(
            "UPDATE {t}messages SET compacted = TRUE WHERE session = ? AND NOT compacted"
        )
        self.touch = q("UPDATE {t}sessions SET updated_at = ? WHERE id = ?")
        # A turn of the session runs (SQLite schema 5, PostgreSQL's 4): set by the turn's
        # first write, cleared by its last; what is still set at a start was cut off.
        self.running = q("UPDATE {t}sessions SET running = ? WHERE id = ?")
        self.interrupted = q("SELECT id FROM {t}sessions WHERE running ORDER BY id")
        self.list = q(
            "SELECT s.id, s.slot, s.turns, s.untrusted,"
            " (SELECT COUNT(*) FROM {t}messages m WHERE m.session = s.id),"
            " s.created_at, s.updated_at, s.parent, s.agent FROM {t}sessions s ORDER BY s.id"
        )
        self.history = q(
            "SELECT seq, body, compacted, at FROM {t}messages WHERE session = ? ORDER BY seq"
        )
        self.children = q("SELECT id FROM {t}sessions WHERE substr(id, 1, ?) = ?")
        self.row = q(
            "SELECT s.baseline, b.body, s.slot, s.turns, s.untrusted, s.next_call_id, s.parent,"
            " s.agent FROM {t}sessions s LEFT JOIN {t}baselines b ON b.hash = s.baseline"
            " WHERE s.id = ?"
        )
        self.baseline = q(
            "INSERT INTO {t}baselines (hash, body) VALUES (?, ?) ON CONFLICT DO NOTHING"
        )
        self.session = q(
            "INSERT INTO {t}sessions (id, baseline, parent, slot, turns, next_call_id, untrusted,"
            " created_at, updated_at, agent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.last_seq = q("SELECT COALESCE(MAX(seq), 0) FROM {t}messages WHERE session = ?")
        self.message = q(
            "INSERT INTO {t}messages (session, seq, body, compacted, at) VALUES (?, ?, ?, FALSE, ?)"
        )
        self.live = q(
            "SELECT seq, body FROM {t}messages WHERE session = ? AND NOT compacted ORDER BY seq"
        )
        self.save_background = q(
            "INSERT INTO {t}background (child, parent, call_id, report, untrusted, at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (child) DO UPDATE SET"
            " report = excluded.report, untrusted = excluded.untrusted, at = excluded.at"
        )
        self.drop_background = q("DELETE FROM {t}background WHERE child = ?")
        self.load_background = q(
            "SELECT child, parent, call_id, report, untrusted FROM {t}background ORDER BY at, child"
        )
        self.approval = q(
            "INSERT INTO {t}approvals (session, call_id, body, at, deadline, decided)"
            " VALUES (?, ?, ?, ?, ?, FALSE) ON CONFLICT DO NOTHING"
        )
        self.approval_body = q(
            "SELECT body FROM {t}approvals WHERE session = ? AND call_id = ? AND NOT decided"
            + d.for_update
        )
        self.settle = q(
            "UPDATE {t}approvals SET body = ?, decided = TRUE"
            " WHERE session = ? AND call_id = ? AND NOT decided"
        )
        self.respend = q(
            "UPDATE {t}approvals SET body = ? WHERE session = ? AND call_id = ? AND NOT decided"
        )
        # A decided row the runtime carries out now: its work must never run again.
        self.decided_body = q(
            "SELECT body FROM {t}approvals WHERE session = ? AND call_id = ? AND decided"
            + d.for_update
        )
        self.mark_ran = q("UPDATE {t}approvals SET body = ? WHERE session = ? AND call_id = ?")
        self.drop_approval = q("DELETE FROM {t}approvals WHERE session = ? AND call_id = ?")
        self.decided_of = q("SELECT body FROM {t}approvals WHERE session = ? AND decided")
        self.approvals = q("SELECT body FROM {t}approvals ORDER BY at, session, call_id")
