"""The A2A executor: one task is one turn of the session its context names.

A :class:`Watch` follows one turn: it subscribes to the runtime's events of the session's
family (children by the id rule) before the turn is sent, and takes the turn's outcome from a
mailbox at a directory address. ``execute`` turns what the watch sees into the SDK's status and
artifact updates (:mod:`.mapping` says which), and returns when the turn ends or a call waits
for a person (``INPUT_REQUIRED``); the watch outlives that return, and the follow-up's
``execute`` settles the call and goes on following the same watch. After a restart there is no
watch for a waiting task: the follow-up makes one from the events alone, and the turn's end
(its ``TurnEnded``) with the answer read from the store.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from google.protobuf import json_format, struct_pb2

from actors.aio import AsyncRuntime
from actors.core.dispatch import descends_from
from actors.dispatcher.loop_inbox import LoopInbox
from actors.shells.service.a2a.mapping import (
    INPUT_REQUIRED,
    Refused,
    Update,
    decision_of,
    event_update,
    outcome_update,
)
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    FailReason,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    TurnOutcome,
)

__all__ = ["LoopdExecutor", "Watch", "data_of", "metadata_of", "text_of"]

ANSWER = "answer"
"""The artifact id of a turn's answer (streamed pieces append to it; the end replaces it)."""


def text_of(message: Message) -> str:
    """A message's text parts, joined by blank lines."""
    return "\n\n".join(p.text for p in message.parts if p.WhichOneof("content") == "text")


def data_of(message: Message) -> Any:
    """The first data part of ``message`` as a plain value (numbers as floats), or None."""
    for part in message.parts:
        if part.WhichOneof("content") == "data":
            return json_format.MessageToDict(part.data)
    return None


def metadata_of(message: Message) -> dict[str, Any]:
    """The message's own ``metadata`` as a plain dict (empty if none)."""
    if not message.HasField("metadata"):
        return {}
    found: dict[str, Any] = json_format.MessageToDict(message.metadata)
    return found


def _agent_message(task_id: str, context_id: str, text: str) -> Message:
    return Message(
        message_id=uuid.uuid4().hex,
        task_id=task_id,
        context_id=context_id,
        role=Role.ROLE_AGENT,
        parts=[Part(text=text)],
    )


def _data_part(value: Any) -> Part:
    data = struct_pb2.Value()
    json_format.ParseDict(value, data)
    return Part(data=data)


class Watch:
    """One turn followed for its task: the family's events and the outcome, in one queue."""

    def __init__(self, runtime: AsyncRuntime, session: str, task_id: str) -> None:
        self.runtime = runtime
        self.session = session
        self.task_id = task_id
        self.items: asyncio.Queue[TurnEvent | TurnOutcome] = asyncio.Queue()
        self.streamed = False
        """A piece of the answer was sent: the next ones append to the artifact."""
        self.due: dict[tuple[str, int], ApprovalRequested] = {}
        """The calls announced as waiting (``INPUT_REQUIRED``) and not yet settled."""
        self.outcome: asyncio.Future[TurnOutcome] = asyncio.get_running_loop().create_future()
        self.from_events = False
        self._inbox = LoopInbox(asyncio.get_running_loop(), self.items.put_nowait, "a2a")
        self._unsubscribe = runtime.runtime.subscribe(self._offer, inline=True)
        self._address: str | None = None
        self._mailbox: Any = None

    def _offer(self, event: TurnEvent) -> None:
        """On the emitting thread: queue the family's events for the loop (nothing else)."""
        session = getattr(event, "session", None)
        if session is not None and (
            session == self.session or descends_from(session, self.session)
        ):
            self._inbox.put(event)

    def send(self, text: str, agent: str | None) -> None:
        """Start the turn; its outcome comes to this watch's queue."""
        runtime = self.runtime.runtime
        self._address = runtime.directory.unique("a2a")
        self._mailbox = self.runtime.future_mailbox(self.outcome)
        runtime.directory.register(self._address, self._mailbox)
        self.outcome.add_done_callback(lambda done: self.items.put_nowait(done.result()))
        runtime.send_turn(self.session, text, reply_to=self._address, agent=agent)

    def follow_events(self) -> None:
        """No outcome will come by mail (a turn of an earlier run): its ``TurnEnded`` ends it."""
        self.from_events = True

    def ending(self, event: TurnEvent) -> TurnEnded | None:
        """``event`` if it ends a turn followed by its events alone."""
        if self.from_events and isinstance(event, TurnEnded) and event.session == self.session:
            return event
        return None

    def close(self) -> None:
        """Stop following: unsubscribe, and free the address."""
        self._unsubscribe()
        if self._address is not None:
            self.runtime.runtime.directory.unregister(self._address, self._mailbox)
            self._address = None


class LoopdExecutor(AgentExecutor):
    """The SDK's executor over a running runtime (see the module's docstring)."""

    def __init__(self, runtime: AsyncRuntime, answer_of: Any) -> None:
        self.runtime = runtime
        self.watches: dict[str, Watch] = {}
        """The turns followed now, by task id."""
        self._answer_of = answer_of
        """``answer_of(session) -> str``: the last answer stored (a worker thread calls it)."""

    def busy(self, session: str) -> str | None:
        """The id of the task whose turn runs on ``session`` now, if any."""
        for task_id, watch in self.watches.items():
            if watch.session == session:
                return task_id
        return None

    async def due(self, task_id: str, session: str) -> list[ApprovalRequested]:
        """The calls a follow-up of ``task_id`` may settle: those its status announced, or
        after a restart, the family's waiting calls."""
        watch = self.watches.get(task_id)
        if watch is not None and not watch.from_events:
            return list(watch.due.values())
        waiting = await self.runtime.pending_approvals()
        return [r for r in waiting if r.session == session or descends_from(r.session, session)]

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        """A new task starts a turn; a follow-up of a waiting one settles the call."""
        task_id, context_id = str(context.task_id), str(context.context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        message = context.message
        assert message is not None
        if context.current_task is None:
            watch = Watch(self.runtime, context_id, task_id)
            self.watches[task_id] = watch
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
                    history=[message],
                )
            )
            skill = metadata_of(message).get("skill")
            try:
                watch.send(text_of(message), skill)
            except (TypeError, ValueError, RuntimeError) as exc:
                self._drop(task_id)
                await updater.failed(self._say(updater, f"refused: {exc}"))
                return
        else:
            watch = self.watches.get(task_id) or self._rewatch(task_id, context_id)
            await self._settle(watch, message, updater)
        try:
            await self._follow(watch, updater)
        except BaseException:
            self._drop(task_id)  # cancelled (CancelTask, a stop): the watch goes with it
            raise

    def _rewatch(self, task_id: str, session: str) -> Watch:
        watch = Watch(self.runtime, session, task_id)
        watch.follow_events()
        self.watches[task_id] = watch
        return watch

    async def _settle(self, watch: Watch, message: Message, updater: TaskUpdater) -> None:
        """Settle the call the follow-up's data part names (checked before the executor ran,
        by the request's builder; a call settled meanwhile is only reported)."""
        due = await self.due(watch.task_id, watch.session)
        try:
            decision, session = decision_of(data_of(message), due)
        except Refused as exc:  # no longer due (decided elsewhere, timed out): go on following
            await updater.start_work(self._say(updater, f"not settled: {exc}"))
            return
        if decision.approve:
            answer = await self.runtime.approve(session, decision.call_id, decision.reason or None)
        else:
            answer = await self.runtime.deny(session, decision.call_id, decision.reason)
        watch.due.pop((session, decision.call_id), None)
        how = "approved" if decision.approve else "declined"
        if isinstance(answer, ApprovalRefused):
            how = f"not settled: {answer.detail}"
        await updater.start_work(
            self._say(updater, f"call_id {decision.call_id} of {session} {how}")
        )

    async def _follow(self, watch: Watch, updater: TaskUpdater) -> None:
        """Publish what the turn does until it ends (done) or waits for a person (parked)."""
        while True:
            item = await watch.items.get()
            if isinstance(item, TurnCompleted | TurnFailed):
                await self._finish(updater, outcome_update(item))
                self._drop(watch.task_id)
                return
            ended = watch.ending(item)
            if ended is not None:
                await self._finish(updater, outcome_update(await self._outcome(ended)))
                self._drop(watch.task_id)
                return
            update = event_update(item, watch.session)
            if update is None:
                continue
            if update.state == INPUT_REQUIRED:
                assert isinstance(item, ApprovalRequested)
                watch.due[(item.session, item.call_id)] = item
                await updater.requires_input(self._say(updater, update.text))
                return  # parked: the follow-up's execute goes on with this watch
            if update.artifact is not None:  # the first piece makes the artifact
                await updater.add_artifact(
                    [Part(text=update.artifact)], artifact_id=ANSWER, append=watch.streamed
                )
                watch.streamed = True
            else:
                await updater.start_work(self._say(updater, update.text))

    async def _outcome(self, ended: TurnEnded) -> TurnOutcome:
        if ended.completed:
            content = await asyncio.to_thread(self._answer_of, ended.session)
            return TurnCompleted(ended.session, content, output=ended.output)
        reason = ended.reason or FailReason.CRASHED
        return TurnFailed(ended.session, reason, ended.detail)

    async def _finish(self, updater: TaskUpdater, update: Update) -> None:
        if update.artifact is not None:
            parts = [Part(text=update.artifact)]
            if update.data is not None:
                parts.append(_data_part(update.data))
            await updater.add_artifact(parts, artifact_id=ANSWER, append=False, last_chunk=True)
        state = TaskState.Value(update.state)
        message = self._say(updater, update.text) if update.text else None
        await updater.update_status(state, message=message)

    def _say(self, updater: TaskUpdater, text: str) -> Message:
        return _agent_message(updater.task_id, updater.context_id, text)

    def _drop(self, task_id: str) -> None:
        watch = self.watches.pop(task_id, None)
        if watch is not None:
            watch.close()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """``CancelTask``: cancel the session's turn and its family, as ``Runtime.cancel``."""
        task_id, context_id = str(context.task_id), str(context.context_id)
        self._drop(task_id)
        cancelled = await self.runtime.cancel(context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        text = f"cancelled: {', '.join(cancelled) or context_id}"
        await updater.cancel(self._say(updater, text))
