"""The Runtime facade over a Ray cluster: the same calls, the sessions on shard actors.

``Runtime.start(config)`` with ``[cluster] engine = "ray"`` returns a :class:`ClusterRuntime`. It
joins (or starts) Ray, starts ``shards`` :class:`~actors.cluster.shard.Shard` actors over the
shared PostgreSQL store, and routes each call to the shard of the session's family
(:func:`~actors.cluster.routing.shard_of`). Ray does the process management, the transport and
the restarts; loopd adds no protocol of its own: each call is one Ray actor method call whose
arguments are ids and text and whose answer is msgspec bytes.

A shard whose process dies during a turn answers that turn ``TurnFailed(CRASHED)`` (Ray fails
the call at once); Ray starts the shard again (``max_restarts``), and the next turn of the
session opens it from the store and repairs the cut-off turn, as after a crash of one process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import msgspec
import pykka

from actors.cluster.routing import shard_of
from actors.cluster.shard import Shard
from actors.core.config import Config, check_wait
from actors.dispatcher.directory import Directory
from actors.runtime import Runtime, check_outcome, check_turn, turn_timed_out
from actors.services.events import Subscribers
from actors.stores.open import open_store
from actors.tools.tool import PortTool
from messages import FailReason, TurnEvent, TurnFailed, TurnOutcome, check_session_id

__all__ = ["ClusterRuntime", "ShardStartError"]

log = logging.getLogger(__name__)

START_TIMEOUT_S = 180.0
"""How long the shards may take to start (a cold Ray worker imports loopd and connects)."""
RESTART_POLL_S = 0.2
"""How often a call waits again for a shard that Ray is restarting."""
POLL_WAIT_S = 1.0
"""How long one fetch of events waits at the shard for the first new event."""
MAX_CONCURRENCY = 256
"""Calls one shard serves at once (each running turn holds one of its threads)."""

_OUTCOME = msgspec.msgpack.Decoder(TurnOutcome)
_EVENT = msgspec.msgpack.Decoder(TurnEvent)


class ShardStartError(RuntimeError):
    """The shards of a cluster runtime could not be started; the message says why."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ShardStartError(
            f"[cluster] engine = 'ray' needs Ray ({exc}): pip install '.[ray]' in loopd's checkout"
        ) from exc
    return ray


def _no_output(output: Any) -> None:
    """``run_turn(output=...)`` is not carried to shards yet: refuse it before anything runs."""
    if output is not None:
        raise ValueError(
            "a cluster runtime does not take run_turn(output=...) yet; give the agent profile "
            "an output_schema instead"
        )


class ClusterRuntime(Runtime):
    """A :class:`~actors.runtime.Runtime` whose sessions run on Ray shard actors.

    ``run_turn``, ``send_turn``, ``cancel``, ``subscribe`` and ``stop`` behave as for one
    process; events stream back from every shard (one thread per shard fetches them), so a
    subscriber sees a family's events in order. There is no single Context to ``tell``:
    :attr:`context` raises.
    """

    def __init__(
        self,
        config: Config,
        shards: list[Any],
        owns_ray: bool,
        subscribe: Iterable[Callable[[TurnEvent], Any]] = (),
    ) -> None:
        """Use started ``shards`` (Ray actor handles); shut Ray down at stop if ``owns_ray``.

        ``subscribe`` functions get every event, first the ``TurnEnded(reason=CRASHED)`` each
        shard's start told for the turns a crash cut off, before this returns."""
        # Not Runtime.__init__: that one takes the actors of one process, which live in the
        # shards here. The facade's calls are all overridden below.
        self.config = config
        self.directory = Directory()
        self._subscribers = Subscribers()
        self._stopped = False
        self._shards = shards
        self._owns_ray = owns_ray
        self._halt = threading.Event()
        self._seen = [0] * len(shards)
        self._suspect = [False] * len(shards)
        """Shards seen failing: the next call waits until they answer again."""
        self._progress = threading.Condition()
        for fn in subscribe:
            self._subscribers.add(fn)
        # Each shard's start ended what a crash cut off and kept those events: hand them over
        # now, so a subscriber given to the start has them when it returns, as in one process.
        ray = _ray()
        firsts = ray.get(
            [shard.fetch_events.remote("", 0, 0.0) for shard in shards], timeout=START_TIMEOUT_S
        )
        for index, (_epoch, after, items) in enumerate(firsts):
            self._deliver(items)
            self._seen[index] = after
        self._pollers = [
            threading.Thread(
                target=self._poll,
                args=(i, firsts[i][0], firsts[i][1]),
                name=f"loopd-shard-{i}-events",
            )
            for i in range(len(shards))
        ]
        for poller in self._pollers:
            poller.daemon = True
            poller.start()

    @classmethod
    def launch(
        cls,
        config: Config,
        *,
        tools: Iterable[PortTool] = (),
        subscribe: Iterable[Callable[[TurnEvent], Any]] = (),
    ) -> ClusterRuntime:
        """Join (or start) Ray and start ``config.cluster.shards`` shards; wait until all run.
        ``subscribe`` as for :class:`ClusterRuntime`.

        Raises :class:`~actors.stores.base.StoreError` if the store cannot be opened and
        :class:`ShardStartError` if Ray or a shard cannot start.
        """
        ray = _ray()
        open_store(config).close()  # the schema exists, and the url works, before any shard
        owns_ray = not ray.is_initialized()
        if owns_ray:
            address = None if config.cluster.address == "local" else config.cluster.address
            try:
                ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            except Exception as exc:
                raise ShardStartError(f"cannot start or join Ray at {address!r}: {exc}") from exc
        count = config.cluster.shards
        shard_class = ray.remote(Shard).options(
            max_restarts=config.cluster.max_restarts,
            max_task_retries=0,  # a turn is never run twice behind its caller's back
            max_concurrency=MAX_CONCURRENCY,
            num_cpus=0,  # a shard waits on the model and the store; it books no CPU
        )
        data = msgspec.msgpack.encode(config)
        tool_list = list(tools)
        handles = [shard_class.remote(data, i, count, tool_list) for i in range(count)]
        try:
            ray.get([h.ready.remote() for h in handles], timeout=START_TIMEOUT_S)
            return cls(config, handles, owns_ray, subscribe)
        except Exception as exc:
            for handle in handles:
                ray.kill(handle, no_restart=True)
            if owns_ray:
                ray.shutdown()
            raise ShardStartError(f"the shards did not start: {exc}") from exc

    @property
    def context(self) -> pykka.ActorRef[Any]:
        """Not available: each shard has its own Context, in its own process."""
        raise RuntimeError(
            "a cluster runtime has one Context per shard, each in its own process; use "
            "run_turn, send_turn, cancel and subscribe"
        )

    @property
    def shard_count(self) -> int:
        """How many shards host sessions."""
        return len(self._shards)

    def shard_of(self, session: str) -> int:
        """The shard that hosts ``session``'s family."""
        return shard_of(session, len(self._shards))

    def shard_pid(self, index: int, timeout: float = START_TIMEOUT_S) -> int:
        """The process id of shard ``index`` now (a new one after a restart), once it is up."""
        return self._await_shard(index, timeout)

    def _await_shard(self, index: int, timeout: float = START_TIMEOUT_S) -> int:
        """Wait until shard ``index`` answers (Ray refuses calls while it restarts); its pid.

        Raises the Ray error if the shard is dead for good (out of ``max_restarts``), and
        ``TimeoutError`` after ``timeout`` seconds.
        """
        ray = _ray()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"shard {index} did not come back within {timeout} s")
            try:
                pid, _epoch = ray.get(self._shards[index].ready.remote(), timeout=left)
            except ray.exceptions.ActorUnavailableError:
                self._halt.wait(RESTART_POLL_S)
                continue
            except ray.exceptions.GetTimeoutError:
                continue
            self._suspect[index] = False
            return int(pid)

    def _shard(self, index: int) -> Any:
        """Shard ``index``'s handle, once it is up again if it was seen failing."""
        if self._suspect[index]:
            self._await_shard(index)
        return self._shards[index]

    def run_turn(
        self,
        session: str,
        text: str,
        timeout: float | None = None,
        *,
        speaker: str | None = None,
        agent: str | None = None,
        output: Any = None,
    ) -> TurnOutcome:
        """Run one turn of ``session`` on its shard and return how it ended.

        ``output`` (a typed turn) is not carried to shards yet: it raises ``ValueError``
        (a profile's ``output_schema`` works, its answer's ``output`` being the JSON value).

        A shard that dies during the turn answers ``TurnFailed(CRASHED)``. Raises what
        :meth:`Runtime.run_turn <actors.runtime.Runtime.run_turn>` raises, before any shard is
        called (the same checks: :func:`~actors.runtime.check_turn`), and ``TimeoutError``
        after ``timeout`` (the turn goes on).
        """
        _no_output(output)
        start = check_turn(
            self.config, session, text, timeout=timeout, speaker=speaker, agent=agent
        )
        self._check_open()
        index = self.shard_of(session)
        ref = self._shard(index).run_turn.remote(
            session, start.text, start.speaker, timeout, start.agent
        )
        ray = _ray()
        try:
            data = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise turn_timed_out(session, timeout) from None
        except Exception as exc:
            return self._failed(session, index, exc)
        return check_outcome(_OUTCOME.decode(data))

    def _failed(self, session: str, index: int, exc: BaseException) -> TurnOutcome:
        """The outcome of a turn whose call to shard ``index`` raised ``exc``."""
        ray = _ray()
        if isinstance(exc, ray.exceptions.RayActorError):
            self._suspect[index] = True
            detail = (
                f"shard {index} died during the turn ({type(exc).__name__}); Ray starts it "
                "again and the next turn repairs this one"
            )
            return TurnFailed(session, FailReason.CRASHED, detail)
        if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(
            exc.as_instanceof_cause(), TimeoutError
        ):
            raise TimeoutError(f"the turn of {session} did not end in time; it goes on") from exc
        log.error("shard %d failed the turn of %s", index, session, exc_info=exc)
        return TurnFailed(session, FailReason.CRASHED, f"shard {index} failed the call: {exc}")

    def send_turn(
        self,
        session: str,
        text: str,
        *,
        speaker: str | None = None,
        reply_to: str | None = None,
        agent: str | None = None,
        output: Any = None,
    ) -> None:
        """Start a turn without waiting; its outcome goes to ``reply_to`` in :attr:`directory`.

        Raises as :meth:`run_turn` does, before any shard is called.
        """
        _no_output(output)
        start = check_turn(self.config, session, text, speaker=speaker, agent=agent)
        self._check_open()
        index = self.shard_of(session)
        ref = self._shard(index).run_turn.remote(
            session, start.text, start.speaker, None, start.agent
        )
        if reply_to is None:
            return

        def answer(done: Future[Any]) -> None:
            try:
                outcome = _OUTCOME.decode(done.result())
            except Exception as exc:
                try:
                    outcome = self._failed(session, index, exc)
                except TimeoutError:
                    return
            self.directory.tell(reply_to, outcome)

        ref.future().add_done_callback(answer)

    def cancel(self, session: str, timeout: float = 10.0) -> tuple[str, ...]:
        """Cancel ``session``'s running turn and its children on their shard; the ids."""
        self._check_cancel(session, timeout)
        ray = _ray()
        ref = self._shard(self.shard_of(session)).cancel.remote(session, timeout)
        return tuple(ray.get(ref, timeout=timeout + 5.0))

    def wait_family(self, session: str, timeout: float | None = None) -> None:
        """Wait on ``session``'s shard until its family is idle (see
        :meth:`Runtime.wait_family`); ``TimeoutError`` after ``timeout`` seconds."""
        check_session_id(session)
        check_wait(timeout, "timeout")
        self._check_open()
        ray = _ray()
        ref = self._shard(self.shard_of(session)).wait_family.remote(session, timeout)
        try:
            ray.get(ref, timeout=None if timeout is None else timeout + 5.0)
        except (TimeoutError, ray.exceptions.GetTimeoutError):
            raise TimeoutError(f"the family of {session} was not idle within {timeout} s") from None

    def _deliver(self, items: list[bytes]) -> None:
        """Decode each event and call every subscriber with it, in order."""
        for data in items:
            event = _EVENT.decode(data)
            for fn in self._subscribers.snapshot():
                try:
                    fn(event)
                except Exception:
                    log.exception("event subscriber %r failed", fn)

    def _poll(self, index: int, epoch: str, after: int) -> None:
        """Fetch shard ``index``'s events above ``after`` of its start ``epoch`` and call the
        subscribers, until the runtime stops."""
        ray = _ray()
        shard = self._shards[index]
        while not self._halt.is_set():
            try:
                epoch, after, items = ray.get(
                    shard.fetch_events.remote(epoch, after, POLL_WAIT_S),
                    timeout=POLL_WAIT_S + 30.0,
                )
            except Exception as exc:
                # The shard is restarting (or gone): try again shortly; its new epoch resets.
                log.debug("events of shard %d: %s", index, exc)
                if isinstance(exc, ray.exceptions.RayActorError):
                    self._suspect[index] = True
                self._halt.wait(0.5)
                continue
            self._deliver(items)
            with self._progress:
                self._seen[index] = after
                self._progress.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every shard's runtime (every held turn is answered), deliver their last events,
        then end the shard actors (and Ray, if this runtime started it)."""
        if self._stopped:
            return
        self._stopped = True
        ray = _ray()
        lasts: list[int | None] = []
        for index, shard in enumerate(self._shards):
            try:
                lasts.append(ray.get(shard.stop.remote(timeout), timeout=timeout + 5.0))
            except Exception as exc:
                log.warning("shard %d did not stop cleanly: %s", index, exc)
                lasts.append(None)
        with self._progress:  # the events emitted while stopping reach the subscribers

            def delivered() -> bool:
                pairs = zip(self._seen, lasts, strict=True)
                return all(last is None or seen >= last for seen, last in pairs)

            self._progress.wait_for(delivered, timeout=3 * POLL_WAIT_S)
        self._halt.set()
        for poller in self._pollers:
            poller.join(timeout=POLL_WAIT_S + 5.0)
        # Every event handed over is acknowledged, so the outbox keeps only what was not.
        closing = [
            shard.close_events.remote(seen, timeout)
            for shard, seen, last in zip(self._shards, self._seen, lasts, strict=True)
            if last is not None
        ]
        try:
            ray.get(closing, timeout=timeout + 5.0)
        except Exception as exc:
            log.warning("the shards' outboxes were not closed cleanly: %s", exc)
        for shard in self._shards:
            ray.kill(shard, no_restart=True)
        if self._owns_ray:
            ray.shutdown()
