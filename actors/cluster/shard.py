"""A shard: one loopd runtime (Context, sessions, pools, store actor) inside a Ray actor.

:class:`Shard` is a plain class; :class:`~actors.cluster.runtime.ClusterRuntime` makes it a Ray
actor (``ray.remote(Shard)``) so Ray starts it in a worker process and starts it again when that
process dies. Everything that crosses to or from a shard is msgspec bytes (the config, turn
outcomes, events) or plain text and ids; port tools, if any, are pickled by Ray once, at start.

A shard hosts the families whose top-level id hashes to it, over the shared PostgreSQL store,
and runs the scheduler jobs of those sessions only, so each job is scheduled by exactly one
scheduler in the cluster.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import msgspec

from actors.cluster.routing import shard_of
from actors.core.config import ClusterConfig, Config
from actors.runtime import Runtime
from actors.stores.open import open_store
from actors.stores.outbox_rows import OutboxRows
from actors.tools.tool import PortTool
from messages import FailReason, TurnEvent, TurnFailed

__all__ = ["EVENTS_KEPT", "EventLog", "Outbox", "Shard", "shard_config"]

EVENTS_KEPT = 10_000
"""Events a shard keeps for the driver to fetch; a driver further behind loses the oldest."""

START_FLUSH_S = 30.0
"""How long a shard's start waits for its first events to be stored in the outbox."""

OUTBOX_RETRY_S = 0.5
"""How long the outbox's writer waits before it tries a failed store again."""

_ENCODER = msgspec.msgpack.Encoder()

log = logging.getLogger(__name__)


def shard_config(config: Config, index: int, shards: int) -> Config:
    """The single-process config shard ``index`` runs: its own home below ``home``, no
    ``[cluster]``, and only the cron and heartbeat jobs of sessions it hosts."""
    cron = tuple(job for job in config.cron if shard_of(job.session, shards) == index)
    heartbeat = config.heartbeat
    if heartbeat is not None and shard_of(heartbeat.session, shards) != index:
        heartbeat = None
    return config.replace(
        home=str(Path(config.home) / f"shard-{index}"),
        cluster=ClusterConfig(),
        cron=cron,
        heartbeat=heartbeat,
    )


class Outbox(Protocol):
    """Where a shard's events wait for its driver: ``PgSessionStore``'s outbox rows."""

    def outbox(self, owner: str, kept: int) -> list[tuple[int, bytes]]:
        """``owner``'s rows left unacknowledged, oldest first (at most ``kept``)."""
        ...

    def save_outbox(
        self, owner: str, rows: Sequence[tuple[int, bytes]], acknowledged: int, kept: int
    ) -> None:
        """Store ``rows`` and delete those up to ``acknowledged`` (and past ``kept``)."""
        ...

    def close(self) -> None:
        """Close the connection."""
        ...


class EventLog:
    """The events of one shard, numbered from 1, for a driver that fetches them in order.

    With an ``outbox``, an event is handed to the driver only once it is stored there, by a
    writer thread of this log, a batch per transaction; the driver's next fetch acknowledges
    what it was handed, and acknowledged rows are deleted. The rows a dead process of this shard
    left (never acknowledged) are read at the start and handed over first, and the numbers go
    on after them, so a driver that keeps its place across the restart gets each event once.
    """

    def __init__(
        self, kept: int = EVENTS_KEPT, outbox: Outbox | None = None, owner: str = ""
    ) -> None:
        """Keep the newest ``kept`` events; store them in ``outbox`` under ``owner``."""
        self._items: deque[tuple[int, bytes]] = deque(maxlen=kept)
        self._kept = kept
        self._outbox = outbox
        self._owner = owner
        self._changed = threading.Condition()
        self._pending: list[tuple[int, bytes]] = []
        self._acknowledged = 0
        self._written_ack = 0
        self._closing = False
        left = [] if outbox is None else outbox.outbox(owner, kept)
        self._items.extend(left)
        self.base = left[-1][0] if left else 0
        """The number this start went on from: the last event a dead process left, or 0."""
        self.handed_over = len(left)
        """How many events a dead process of this shard left for this one to hand over."""
        self._last = self._stored = self.base
        self._writer: threading.Thread | None = None
        if outbox is not None:
            self._writer = threading.Thread(target=self._write, name="loopd-outbox", daemon=True)
            self._writer.start()

    def append(self, event: TurnEvent) -> None:
        """Number ``event`` and keep its msgpack bytes (a subscriber of the shard's runtime)."""
        data = _ENCODER.encode(event)
        with self._changed:
            self._last += 1
            self._items.append((self._last, data))
            if self._outbox is None:
                self._stored = self._last
            else:
                self._pending.append((self._last, data))
            self._changed.notify_all()

    @property
    def last(self) -> int:
        """The number of the newest event the driver may have (0: none yet)."""
        with self._changed:
            return self._stored

    def since(self, after: int, wait_s: float) -> tuple[int, list[bytes]]:
        """The events numbered above ``after`` and the last number, waiting up to ``wait_s``
        for one if there is none yet; ``after`` acknowledges every event up to it."""
        with self._changed:
            if after > self._acknowledged:
                self._acknowledged = after
                if self._outbox is None:  # nothing to delete
                    self._written_ack = after
                self._changed.notify_all()
            self._changed.wait_for(lambda: self._stored > after, wait_s)
            stored = self._stored
            return stored, [data for n, data in self._items if after < n <= stored]

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` s until every event is stored and every acknowledged one
        deleted; the last number stored."""
        with self._changed:
            self._changed.wait_for(
                lambda: not self._pending and self._written_ack >= self._acknowledged, timeout
            )
            return self._stored

    def close(self, acknowledged: int, timeout: float) -> None:
        """Acknowledge up to ``acknowledged``, store what is left, stop the writer."""
        with self._changed:
            self._acknowledged = max(self._acknowledged, acknowledged)
            self._closing = True
            self._changed.notify_all()
        if self._writer is not None:
            self._writer.join(timeout)
        if self._outbox is not None:
            self._outbox.close()

    def _work(self) -> bool:
        return bool(self._pending) or self._acknowledged > self._written_ack or self._closing

    def _write(self) -> None:
        """The writer: store what is pending, delete what was acknowledged, one transaction
        a round; a store that fails is tried again (the events wait, none is handed over)."""
        assert self._outbox is not None
        failures = 0
        while True:
            with self._changed:
                self._changed.wait_for(self._work)
                batch, acknowledged = list(self._pending), self._acknowledged
                if not batch and acknowledged == self._written_ack and self._closing:
                    return
            try:
                self._outbox.save_outbox(self._owner, batch, acknowledged, self._kept)
            except Exception as exc:
                failures += 1
                level = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(level, "shard outbox %s: %s; trying again", self._owner, exc)
                with self._changed:
                    if self._closing:
                        return
                    self._changed.wait(OUTBOX_RETRY_S)
                continue
            failures = 0
            with self._changed:
                del self._pending[: len(batch)]
                if batch:
                    self._stored = batch[-1][0]
                self._written_ack = acknowledged
                self._changed.notify_all()


class Shard:
    """A Ray actor's body: a started loopd runtime and the calls the driver makes on it.

    Each method is one request of the driver; they run on the actor's thread pool
    (``max_concurrency``), so a turn that takes minutes never blocks another session's turn.
    """

    def __init__(
        self, config: bytes, index: int, shards: int, tools: Sequence[PortTool] = ()
    ) -> None:
        """Start the runtime of shard ``index`` of ``shards`` on ``config`` (msgpack bytes)."""
        cluster = msgspec.msgpack.decode(config, type=Config)
        self.index = index
        self.epoch = f"{os.getpid()}-{os.urandom(4).hex()}"
        own = shard_config(cluster, index, shards)
        # The outbox has a connection of its own: its writer never waits behind a turn's.
        outbox = open_store(own) if own.store.url is not None else None
        self.events = EventLog(
            outbox=outbox if isinstance(outbox, OutboxRows) else None, owner=own.home
        )
        # Subscribed from the start: the turns a crash cut off (this shard's previous process,
        # say) are ended by the start, and the driver must hear of it.
        self.runtime = Runtime.start(own, tools=tools, subscribe=[self.events.append])
        self.events.flush(START_FLUSH_S)  # the start's events are in the outbox before ready

    def ready(self) -> tuple[int, str]:
        """This shard's process id and epoch (new at every start): it is up."""
        return os.getpid(), self.epoch

    def run_turn(
        self,
        session: str,
        text: str,
        speaker: str | None,
        timeout: float | None,
        agent: str | None = None,
    ) -> bytes:
        """Run one turn; its outcome as msgpack bytes (``TurnCompleted`` or ``TurnFailed``).

        A stored session of another agent profile than ``agent`` is ``TurnFailed(WRONG_AGENT)``
        (the caller's runtime raises ``ValueError`` for it, as a local one does)."""
        try:
            outcome = self.runtime.run_turn(session, text, timeout, speaker=speaker, agent=agent)
        except ValueError as exc:
            if agent is None:
                raise
            outcome = TurnFailed(session, FailReason.WRONG_AGENT, str(exc))
        return _ENCODER.encode(outcome)

    def send_turn(self, session: str, text: str, speaker: str | None) -> None:
        """Start a turn without waiting for it."""
        self.runtime.send_turn(session, text, speaker=speaker)

    def cancel(self, session: str, timeout: float) -> tuple[str, ...]:
        """Cancel ``session``'s turn and its children's; the ids cancelled."""
        return self.runtime.cancel(session, timeout)

    def wait_family(self, session: str, timeout: float | None) -> bool:
        """Return once ``session``'s family is idle, background reports included."""
        self.runtime.wait_family(session, timeout)
        return True

    def fetch_events(self, epoch: str, after: int, wait_s: float) -> tuple[str, int, list[bytes]]:
        """Events above ``after`` (all of them if ``epoch`` is not this start's), waiting up
        to ``wait_s`` for the first; with this start's epoch and the last event number."""
        # A driver new to this start keeps its place only up to where this start went on
        # from (the last event a dead process left): what it has of before is acknowledged.
        last, items = self.events.since(
            after if epoch == self.epoch else min(after, self.events.base), wait_s
        )
        return self.epoch, last, items

    def stop(self, timeout: float) -> int:
        """Stop the runtime (every held turn is answered, the store is left consistent); the
        number of the last event, so the driver knows when it has them all."""
        self.runtime.stop(timeout)
        return self.events.flush(timeout)

    def close_events(self, acknowledged: int, timeout: float) -> None:
        """The driver has every event up to ``acknowledged``: delete them from the outbox and
        stop its writer (after :meth:`stop`)."""
        self.events.close(acknowledged, timeout)
