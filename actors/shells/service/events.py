"""Turn events to the service's SSE clients: one subscription to the runtime, numbered events,
a bounded replay buffer and a bounded queue per client.

The runtime calls :meth:`EventHub.offer` inline, on the actor thread that emits the event (no
hop to the event bus's thread); that only queues the event for the service's loop (a
:class:`~actors.dispatcher.loop_inbox.LoopInbox`: a burst of events is one wake-up of the
loop), so no client, however slow, ever holds up an actor. On the loop each event gets
the next id, is kept in the replay buffer, and is appended to the queue of every client whose
filter it passes; its SSE frame is encoded once, when the first client needs it. A client
whose queue is full has fallen behind: it is told (a ``dropped`` event naming the last id it
was sent) and its stream ends; it may reconnect with ``Last-Event-ID`` to replay what the buffer
still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec

from actors.core.dispatch import descends_from
from actors.dispatcher.loop_inbox import LoopInbox
from messages import (
    ApprovalRequested,
    ApprovalSettled,
    FailReason,
    SubagentFinished,
    SubagentStarted,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)

__all__ = ["EventHub", "SessionStates", "Subscriber", "control_frame", "event_frame"]

log = logging.getLogger(__name__)


def event_frame(number: int, event: TurnEvent) -> bytes:
    """One SSE frame: ``id:`` the number, ``event:`` the event's tag, ``data:`` its JSON."""
    tag = type(event).__struct_config__.tag
    data = msgspec.json.encode(event)  # one line: JSON escapes every newline
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (number, str(tag).encode(), data)


def control_frame(kind: str, **fields: Any) -> bytes:
    """A frame of the service itself (``dropped``, ``gap``): no ``id:``, so a client's
    ``Last-Event-ID`` stays the last turn event's."""
    data = msgspec.json.encode({"type": kind, **fields})
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), data)


def outcome_state(completed: bool, reason: FailReason | None) -> str:
    """The state a turn's outcome leaves: ``completed``, ``cancelled`` or ``failed``."""
    if completed:
        return "completed"
    return "cancelled" if reason is FailReason.CANCELLED else "failed"


class SessionStates:
    """What the events say of each session: its state (``running``, ``waiting``, a turn's
    outcome) and whether it runs in the background. Fed on the loop, one event at a time;
    at most ``limit`` sessions are kept (the oldest forgotten first: the store tells theirs)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._state: dict[str, str] = {}
        self._background: set[str] = set()
        self._waits: dict[str, set[int]] = {}

    def see(self, event: TurnEvent) -> None:
        """Take ``event`` into account (events of other kinds change nothing)."""
        match event:
            case TurnStarted(session=session):
                self._waits.pop(session, None)
                self._set(session, "running")
            case ApprovalRequested(session=session, call_id=call_id):
                self._waits.setdefault(session, set()).add(call_id)
                self._set(session, "waiting")
            case ApprovalSettled(session=session, call_id=call_id):
                waits = self._waits.get(session, set())
                waits.discard(call_id)
                if not waits and self._state.get(session) == "waiting":
                    self._set(session, "running")
            case TurnEnded(session=session, completed=completed, reason=reason):
                self._waits.pop(session, None)
                self._set(session, outcome_state(completed, reason))
            case SubagentStarted(child=child, background=background):
                if background:
                    self._background.add(child)
                self._set(child, "running")
            case SubagentFinished(child=child, completed=completed, reason=reason):
                if self._state.get(child) in ("running", "waiting", None):
                    self._waits.pop(child, None)
                    self._set(child, outcome_state(completed, reason))
            case _:
                pass

    def _set(self, session: str, state: str) -> None:
        self._state.pop(session, None)  # re-inserted last: the dict stays oldest first
        self._state[session] = state
        while len(self._state) > self.limit:
            oldest = next(iter(self._state))
            del self._state[oldest]
            self._background.discard(oldest)
            self._waits.pop(oldest, None)

    def of(self, session: str) -> tuple[str, bool] | None:
        """``(state, background)`` of ``session``; None if the events never told of it."""
        state = self._state.get(session)
        return None if state is None else (state, session in self._background)

    def known(self) -> dict[str, tuple[str, bool]]:
        """Every session the events told of: ``(state, background)``."""
        return {s: (state, s in self._background) for s, state in self._state.items()}


class _Entry:
    """A numbered event; its SSE frame is encoded the first time a client needs it (most events
    of a service nobody watches leave the replay buffer unread)."""

    __slots__ = ("_frame", "event", "number", "session")

    def __init__(self, number: int, event: TurnEvent) -> None:
        self.number = number
        self.session = event.session
        self.event: TurnEvent | None = event
        self._frame: bytes | None = None

    @property
    def frame(self) -> bytes:
        """The event's SSE frame (encoded once)."""
        if self._frame is None:
            assert self.event is not None
            self._frame = event_frame(self.number, self.event)
            self.event = None
        return self._frame


class Subscriber:
    """One client's queue of frames, filled on the loop by the hub, drained by its stream."""

    def __init__(self, hub: EventHub, session: str | None, limit: int) -> None:
        self._hub = hub
        self.session = session
        self.limit = limit
        self.frames: deque[bytes] = deque()
        self.last_sent = 0
        """The id of the last event put in this client's queue."""
        self.dropped = False
        self.closed = False
        self._wake = asyncio.Event()

    def wants(self, session: str) -> bool:
        """True if an event of ``session`` passes this client's filter (its family)."""
        return (
            self.session is None or session == self.session or descends_from(session, self.session)
        )

    def offer(self, entry: _Entry) -> None:
        """Queue ``entry``'s frame, or drop this client if its queue is full."""
        if self.closed or not self.wants(entry.session):
            return
        if len(self.frames) >= self.limit:
            self.frames.clear()
            self.frames.append(
                control_frame(
                    "dropped",
                    last_event_id=self.last_sent,
                    detail=f"this client fell more than {self._hub.client_queue} events behind; "
                    "reconnect "
                    f"with Last-Event-ID: {self.last_sent} to replay what the buffer still holds",
                )
            )
            self.dropped = True
            self.close()
            return
        self.frames.append(entry.frame)
        self.last_sent = entry.number
        self._wake.set()

    def close(self) -> None:
        """End this client's stream once its queue is sent; the hub forgets it."""
        self.closed = True
        self._hub.forget(self)
        self._wake.set()

    async def next_frames(self, timeout: float) -> list[bytes] | None:
        """The frames waiting now (an empty list after ``timeout`` seconds without any), or
        None once the stream has ended and everything was taken."""
        if not self.frames and not self.closed:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
        if not self.frames:
            return None if self.closed else []
        frames = list(self.frames)
        self.frames.clear()
        return frames


class EventHub:
    """The service's side of the event bus: ids, the replay buffer, the clients."""

    def __init__(self, replay_events: int = 1000, client_queue: int = 1024) -> None:
        self.replay_events = replay_events
        self.client_queue = client_queue
        self._buffer: deque[_Entry] = deque(maxlen=replay_events or None)
        self._next = 1
        self._clients: set[Subscriber] = set()
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False
        self.states = SessionStates()
        """Each session's state as the events tell it."""
        # Filled by actor threads, drained on the loop; made by attach.
        self._inbox: LoopInbox[TurnEvent] | None = None

    @property
    def clients(self) -> int:
        """How many clients are attached now."""
        return len(self._clients)

    @property
    def last_id(self) -> int:
        """The id of the last event numbered (0 before the first)."""
        return self._next - 1

    def attach(self, subscribe: Callable[[Callable[[TurnEvent], Any]], Callable[[], None]]) -> None:
        """Subscribe to a runtime (``Runtime.subscribe``, inline: :meth:`offer` only queues);
        call on the service's loop."""
        self._inbox = LoopInbox(asyncio.get_running_loop(), self._publish, "the event hub")
        self._unsubscribe = subscribe(self.offer)

    def offer(self, event: TurnEvent) -> None:
        """The runtime's call, on the thread that emitted ``event``: queue it for the loop and
        return at once (any thread may call it; the queue keeps the order of the calls)."""
        inbox = self._inbox
        if inbox is not None and not self._closed:
            inbox.put(event)  # False once the loop has closed: nobody listens any more

    def _publish(self, event: TurnEvent) -> None:
        if self._closed or getattr(event, "session", None) is None:
            return  # an MCP server's event names no session: not a turn event, not streamed
        self.states.see(event)
        entry = _Entry(self._next, event)
        self._next += 1
        if self.replay_events:
            self._buffer.append(entry)
        for client in list(self._clients):
            client.offer(entry)

    def open(self, session: str | None, last_event_id: int | None = None) -> Subscriber:
        """A new client of ``session``'s family (every session's with None); with
        ``last_event_id``, its queue starts with the buffered events after that id (and a
        ``gap`` frame first if the buffer no longer reaches back that far)."""
        replay: list[bytes] = []
        client = Subscriber(self, session, self.client_queue)
        if last_event_id is not None:
            oldest = self._buffer[0].number if self._buffer else self._next
            if last_event_id >= self._next:  # an id of an earlier run of the service
                replay.append(
                    control_frame(
                        "gap",
                        after=last_event_id,
                        first=self._next,
                        detail=f"no event {last_event_id} was sent by this service: it has "
                        "restarted and counts from 1 again",
                    )
                )
            elif last_event_id + 1 < oldest:
                replay.append(
                    control_frame(
                        "gap",
                        after=last_event_id,
                        first=oldest,
                        detail=f"events {last_event_id + 1} to {oldest - 1} are no longer "
                        f"buffered (the buffer keeps {self.replay_events})",
                    )
                )
            for entry in self._buffer:
                if entry.number > last_event_id and client.wants(entry.session):
                    replay.append(entry.frame)
                    client.last_sent = entry.number
        client.frames.extend(replay)
        client.limit += len(replay)  # the replay does not count against the live queue
        if self._closed:
            client.closed = True
        else:
            self._clients.add(client)
        return client

    def forget(self, client: Subscriber) -> None:
        """Stop feeding ``client``."""
        self._clients.discard(client)

    def close(self) -> None:
        """Unsubscribe from the runtime and end every client's stream (on the loop)."""
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for client in list(self._clients):
            client.close()
