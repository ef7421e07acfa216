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

import os
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import msgspec

from actors.cluster.routing import shard_of
from actors.core.config import ClusterConfig, Config
from actors.runtime import Runtime
from actors.tools.tool import PortTool
from messages import FailReason, TurnEvent, TurnFailed

__all__ = ["EVENTS_KEPT", "EventLog", "Shard", "shard_config"]

EVENTS_KEPT = 10_000
"""Events a shard keeps for the driver to fetch; a driver further behind loses the oldest."""

_ENCODER = msgspec.msgpack.Encoder()


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


class EventLog:
    """The events of one shard, numbered from 1, for a driver that fetches them in order."""

    def __init__(self, kept: int = EVENTS_KEPT) -> None:
        """Keep the newest ``kept`` events."""
        self._items: deque[tuple[int, bytes]] = deque(maxlen=kept)
        self._last = 0
        self._changed = threading.Condition()

    def append(self, event: TurnEvent) -> None:
        """Number ``event`` and keep its msgpack bytes (a subscriber of the shard's runtime)."""
        data = _ENCODER.encode(event)
        with self._changed:
            self._last += 1
            self._items.append((self._last, data))
            self._changed.notify_all()

    @property
    def last(self) -> int:
        """The number of the newest event (0: none yet)."""
        with self._changed:
            return self._last

    def since(self, after: int, wait_s: float) -> tuple[int, list[bytes]]:
        """The events numbered above ``after`` and the last number, waiting up to ``wait_s``
        for one if there is none yet."""
        with self._changed:
            self._changed.wait_for(lambda: self._last > after, wait_s)
            return self._last, [data for n, data in self._items if n > after]


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
        self.events = EventLog()
        # Subscribed from the start: the turns a crash cut off (this shard's previous process,
        # say) are ended by the start, and the driver must hear of it.
        self.runtime = Runtime.start(
            shard_config(cluster, index, shards), tools=tools, subscribe=[self.events.append]
        )

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
        last, items = self.events.since(after if epoch == self.epoch else 0, wait_s)
        return self.epoch, last, items

    def stop(self, timeout: float) -> int:
        """Stop the runtime (every held turn is answered, the store is left consistent); the
        number of the last event, so the driver knows when it has them all."""
        self.runtime.stop(timeout)
        return self.events.last
