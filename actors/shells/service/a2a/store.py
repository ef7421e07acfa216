"""The A2A tasks in loopd's own session store: the SDK's ``TaskStore`` over the ``a2a_tasks``
table, so ``GetTask`` answers after a restart.

A task is written through (in a worker thread, durably, before the SDK tells a client) when it
is first stored and whenever its state changes; the saves between (a status message while it
works, a streamed piece of the answer) stay in memory, and are in the row by the next state
change. A task that reached a final state leaves memory: its row is the copy. The writes go
through a writable connection of the service's own, beside the store actor's (SQLite's WAL
takes both; PostgreSQL is a server).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Role, Task, TaskState
from google.protobuf import json_format

from actors.core.config import Config
from actors.shells.service.a2a.mapping import FAILED, INPUT_REQUIRED, TERMINAL
from actors.stores.a2a_rows import A2aTaskRow
from actors.stores.base import StoreBackend
from actors.stores.open import open_store

__all__ = ["CRASHED_TEXT", "NOT_WAITING_TEXT", "LoopdTaskStore"]

CRASHED_TEXT = "crashed: the service stopped before the turn ended"
"""The status text of a task found working at start: its turn was cut off."""

NOT_WAITING_TEXT = (
    "crashed: no call of this task waits for a person any more (it was decided or dropped "
    "elsewhere); the session's transcript holds what followed"
)
"""The status text of a task found waiting for input at start whose call no longer waits."""


def _owner(_context: ServerCallContext) -> str:
    return "loopd"  # one owner: the service's token is the only identity


def _body(task: Task) -> bytes:
    text: str = json_format.MessageToJson(task, indent=None)
    return text.encode()


def _task(row: A2aTaskRow) -> Task:
    task = Task()
    json_format.Parse(row.body, task, ignore_unknown_fields=True)
    return task


class LoopdTaskStore(TaskStore):
    """The SDK's task store over loopd's store (see the module's docstring)."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._backend: Any = None
        self._open_lock = threading.Lock()
        self._live: dict[str, Task] = {}
        self._stored_state: dict[str, str] = {}

    def _store(self) -> Any:
        """The writable store (opened on first use, in a worker thread)."""
        with self._open_lock:
            if self._backend is None:
                backend: StoreBackend = open_store(self._config)
                self._backend = backend
            return self._backend

    def _write(self, row: A2aTaskRow) -> None:
        self._store().save_a2a_task(row)

    def _read(self, task_id: str) -> A2aTaskRow | None:
        found: A2aTaskRow | None = self._store().a2a_task(task_id)
        return found

    def rows(self, context: str | None = None) -> list[A2aTaskRow]:
        """Every stored task row (only ``context``'s if given), in a worker thread."""
        return self._rows(context)

    def _rows(self, context: str | None) -> list[A2aTaskRow]:
        found: list[A2aTaskRow] = self._store().a2a_tasks(context)
        return found

    def sweep(self, waiting: Callable[[str], bool]) -> list[str]:
        """At start: every task stored as working is ``FAILED`` (its turn was cut off by a stop
        or a crash); a task waiting for input stays if ``waiting(session)`` (a call of its
        session's family still waits: the wait survived), else it is ``FAILED`` too. The ids
        swept."""
        swept = []
        for row in self._rows(None):
            if row.state in TERMINAL:
                continue
            text = CRASHED_TEXT
            if row.state == INPUT_REQUIRED:
                if waiting(row.context):
                    continue
                text = NOT_WAITING_TEXT
            task = _task(row)
            task.status.state = TaskState.Value(FAILED)
            task.status.message.Clear()
            task.status.message.message_id = f"{task.id}-crashed"
            task.status.message.role = Role.ROLE_AGENT
            task.status.message.parts.add(text=text)
            self._write(A2aTaskRow(task.id, task.context_id, FAILED, _body(task)))
            swept.append(task.id)
        return swept

    def close(self) -> None:
        """Close the writable connection (in a worker thread)."""
        with self._open_lock:
            if self._backend is not None:
                self._backend.close()
                self._backend = None

    async def save(self, task: Task, context: ServerCallContext) -> None:
        """Keep ``task``; write it through when it is new or its state changed."""
        kept = Task()
        kept.CopyFrom(task)
        state = TaskState.Name(kept.status.state)
        if self._stored_state.get(kept.id) != state:
            row = A2aTaskRow(kept.id, kept.context_id, state, _body(kept))
            await asyncio.to_thread(self._write, row)
            self._stored_state[kept.id] = state
        if state in TERMINAL:
            self._live.pop(kept.id, None)
            self._stored_state.pop(kept.id, None)
        else:
            self._live[kept.id] = kept

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        """The task, from memory while it runs, else from its row."""
        live = self._live.get(task_id)
        if live is None:
            row = await asyncio.to_thread(self._read, task_id)
            if row is None:
                return None
            live = _task(row)
        found = Task()
        found.CopyFrom(live)
        return found

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The stored tasks (those in memory as they are now), filtered and paged as the
        SDK's in-memory store does it."""
        rows = await asyncio.to_thread(self._rows, params.context_id or None)
        page = InMemoryTaskStore(owner_resolver=_owner)
        for row in rows:
            task = self._live.get(row.id) or _task(row)
            await page.save(task, context)
        return await page.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        """Forget the task (memory and row)."""
        self._live.pop(task_id, None)
        self._stored_state.pop(task_id, None)
        await asyncio.to_thread(self._store().drop_a2a_task, task_id)
