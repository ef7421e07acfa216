"""The scheduler actor: cron jobs and the heartbeat, as turns the Context runs (``[[cron]]``,
``[heartbeat]``).

:class:`SchedulerActor`, the actor at the address ``scheduler``, owns the state file (the last
run of each job), wakes on :class:`~messages.Tick`, asks the pure
:class:`~actors.core.schedule.Schedule` which jobs are due, and tells the Context a
:class:`~messages.ScheduledTurn` for each. The Context runs it as a turn, or skips it with a
:class:`~messages.JobSkipped` event while the session or one of its descendants is held.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import msgspec
import pykka

from actors.core.config import Config
from actors.core.dispatch import clock_text
from actors.core.files import FileRefused, read_regular_file
from actors.core.schedule import CronEntry, Job, Schedule, as_utc, scheduled_text
from actors.dispatcher.directory import CONTEXT, Directory
from messages import Inspect, JobSkipped, ScheduledTurn, Tick, TurnCompleted, TurnFailed
from messages.base import Message

__all__ = [
    "HEARTBEAT_MAX_BYTES",
    "SCHEDULER",
    "STATE_MAX_BYTES",
    "STATE_NAME",
    "SchedulerActor",
    "SchedulerStateStore",
    "SchedulerStatus",
]

log = logging.getLogger(__name__)

SCHEDULER = "scheduler"
"""The scheduler's address in the :class:`~actors.dispatcher.directory.Directory`."""

STATE_NAME = "scheduler.json"
"""The state file's usual name, under ``home``."""

HEARTBEAT_MAX_BYTES = 256 * 1024
"""The largest heartbeat prompt file read; a larger one is skipped with a warning."""

STATE_MAX_BYTES = 16 * 1024 * 1024
"""The largest state file read; a larger one is treated as corrupt."""

_STATE_VERSION = 1


# --- state ------------------------------------------------------------------------------------


class _State(msgspec.Struct, kw_only=True):
    """The state file: when each job last ran, and when each cron job was first seen."""

    version: int = _STATE_VERSION
    last_runs: dict[str, datetime] = msgspec.field(default_factory=dict)
    first_seen: dict[str, datetime] = msgspec.field(default_factory=dict)


class _CorruptState(Exception):
    """The state file exists but does not hold a state."""


def _read_state(path: Path) -> _State:
    """The state at ``path``; an empty one if there is no file. ``_CorruptState`` if it is not a
    state, ``OSError`` if it cannot be read."""
    try:
        data = read_regular_file(path, STATE_MAX_BYTES)
    except FileNotFoundError:
        return _State()
    except FileRefused as exc:  # a FIFO, a device, or far too big: not a state file
        raise _CorruptState(str(exc)) from exc
    try:
        state = msgspec.json.decode(data, type=_State)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _CorruptState(str(exc)) from exc
    if state.version != _STATE_VERSION:
        raise _CorruptState(f"unknown state version {state.version}")
    return _State(
        last_runs={name: as_utc(at) for name, at in state.last_runs.items()},
        first_seen={name: as_utc(at) for name, at in state.first_seen.items()},
    )


def _aside_path(path: Path) -> Path:
    """A free name to keep a corrupt ``path`` under: ``<name>.corrupt`` (then ``.corrupt.<n>``)."""
    candidate = path.with_name(f"{path.name}.corrupt")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.corrupt.{n}")
        n += 1
    return candidate


def _write_state(path: Path, state: _State) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file, synced, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.json.encode(state))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SchedulerStateStore(Protocol):
    """Where the scheduler keeps its state instead of ``state_path``: a shared store (the
    PostgreSQL one, :class:`~actors.stores.postgres.PgSchedulerState`)."""

    def load(self) -> tuple[dict[str, datetime], dict[str, datetime]]:
        """The last run and the first sighting of each job, by job name."""
        ...

    def save(self, last_runs: dict[str, datetime], first_seen: dict[str, datetime]) -> None:
        """Save these jobs' times (jobs not named are left as they are)."""
        ...


# --- the actor --------------------------------------------------------------------------------


class SchedulerStatus(Message, frozen=True):
    """The scheduler's answer to :class:`~messages.Inspect`.

    ``sent`` counts scheduled turns told to the Context; of their answers, ``runs`` counts the
    completed turns, ``failures`` the failed ones and ``skips`` the jobs skipped because their
    session (or a descendant) was held. ``running`` names the jobs sent and not answered yet.
    """

    jobs: tuple[str, ...]
    last_runs: dict[str, datetime]
    next_wake: datetime | None
    sent: int
    runs: int
    skips: int
    failures: int
    running: tuple[str, ...]


class SchedulerActor(pykka.ThreadingActor):
    """Runs the ``[[cron]]`` jobs and the ``[heartbeat]`` of ``config`` as scheduled turns.

    It registers at the address ``scheduler``. On each :class:`~messages.Tick` it asks the
    :class:`Schedule` which jobs are due at the tick's ``now`` (``clock()`` when the tick has
    none), and for each tells the Context a :class:`~messages.ScheduledTurn` with the text
    ``It is <now>.\\n\\n<prompt>``, answered back here. The heartbeat's prompt is the text of
    ``home/<file>``, read at each run; if it cannot be read (or is empty) that run is skipped
    with a warning and nothing is recorded, so it runs as soon as the file is fixed.

    The last run of each job is saved to ``state_path`` (JSON, written atomically), or to
    ``state_store`` when there is one (a shared PostgreSQL store), before the turn is sent, so
    a restart never repeats a run (a crash in between loses that run instead).
    A missing state file is an empty state; a corrupt one is renamed to ``<name>.corrupt`` with
    a warning, and the scheduler starts empty.

    With ``tick_s`` set, a daemon thread tells the actor a ``Tick()`` every ``tick_s`` seconds
    (never more than one waiting at a time); it stops with the actor. With ``tick_s=None``
    nothing ticks by itself: tests tell ``Tick(now=...)``.
    """

    def __init__(
        self,
        config: Config,
        directory: Directory,
        clock: Callable[[], datetime],
        *,
        state_path: Path,
        tick_s: float | None = 1.0,
        state_store: SchedulerStateStore | None = None,
    ) -> None:
        super().__init__()
        self.state_store = state_store
        if tick_s is not None and not tick_s > 0:
            raise ValueError(f"tick_s must be > 0 or None, not {tick_s!r}")
        self.config = config
        self.directory = directory
        self.clock = clock
        self.state_path = Path(state_path)
        self.tick_s = tick_s
        self.schedule = Schedule.from_config(config)
        self.home = config.home_path
        self.last_runs: dict[str, datetime] = {}
        self.first_seen: dict[str, datetime] = {}
        self.sent = 0
        self.runs = 0
        self.skips = 0
        self.failures = 0
        self._running: dict[str, deque[str]] = {}
        self._saving = True
        self._file_problem: str | None = None
        self._stop_ticks = threading.Event()
        self._tick_waiting = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- life ---

    def on_start(self) -> None:
        """Register at ``scheduler``, load the state, and start the tick thread if any."""
        self.directory.register(SCHEDULER, self.actor_ref)
        self._load()
        seen = self.schedule.mark_seen(self._now(), self.last_runs, self.first_seen)
        if seen != self.first_seen:
            self.first_seen = seen
            self._save()
        if self.tick_s is not None:
            self._ticker = threading.Thread(
                target=_tick_loop,
                args=(self.actor_ref, self.tick_s, self._stop_ticks, self._tick_waiting),
                name="loopd-scheduler-tick",
                daemon=True,
            )
            self._ticker.start()
        log.info(
            "scheduler started with %d job(s): %s", len(self.schedule.jobs), self.schedule.names
        )

    def on_stop(self) -> None:
        """Stop the tick thread and free the address."""
        self._shutdown()

    def on_failure(self, *args: Any) -> None:
        """The actor failed: stop the tick thread and free the address all the same."""
        self._shutdown()

    def _shutdown(self) -> None:
        self._stop_ticks.set()
        ticker = self._ticker
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join(timeout=5)
        self.directory.unregister(SCHEDULER, self.actor_ref)

    # --- messages ---

    def on_receive(self, message: Any) -> Any:
        """Handle a tick, an answer to a scheduled turn, or an :class:`~messages.Inspect`."""
        if isinstance(message, Tick):
            self._tick_waiting.clear()
            self._tick(as_utc(message.now) if message.now is not None else self._now())
        elif isinstance(message, JobSkipped):
            self.skips += 1
            self._answered(message.session, message.job)
            log.info(
                "scheduled job %s skipped: %s held by a running turn",
                message.job,
                ", ".join(message.held),
            )
        elif isinstance(message, TurnCompleted):
            self.runs += 1
            job = self._answered(message.session)
            log.info("scheduled job %s on %s completed", job, message.session)
        elif isinstance(message, TurnFailed):
            self.failures += 1
            job = self._answered(message.session)
            log.warning(
                "scheduled job %s on %s failed (%s): %s",
                job,
                message.session,
                message.reason,
                message.detail,
            )
        elif isinstance(message, Inspect):
            return self._status()
        else:
            log.warning("scheduler: unexpected message %r", message)
        return None

    def _tick(self, now: datetime) -> None:
        self.first_seen = self.schedule.mark_seen(now, self.last_runs, self.first_seen)
        for name in self.schedule.due(now, self.last_runs, self.first_seen):
            try:
                self._run(self.schedule.job(name), now)
            except Exception:  # one job's bug must not stop the others, nor the scheduler
                log.exception("scheduled job %s failed to start", name)

    def _run(self, job: Job, now: datetime) -> None:
        """Record ``job``'s run at ``now`` and tell the Context its turn."""
        name = job.name
        prompt = self._prompt(job)
        if prompt is None:
            return
        agent = job.agent if isinstance(job, CronEntry) else None
        text = scheduled_text(now, prompt)
        turn = ScheduledTurn(name, job.session, text, SCHEDULER, agent=agent)
        self.last_runs[name] = now
        self._save()
        self.sent += 1
        self._running.setdefault(job.session, deque()).append(name)
        log.info("scheduled job %s: a turn on %s at %s", name, job.session, clock_text(now))
        if not self.directory.tell(CONTEXT, turn):
            log.warning("scheduled job %s not sent: no Context is running", name)
            self._answered(job.session, name)

    def _prompt(self, job: Job) -> str | None:
        """The job's prompt, or None (with a warning) if the heartbeat file cannot be used."""
        if isinstance(job, CronEntry):
            return job.prompt
        path = self.home / job.file
        try:
            # A regular file only, and a bounded one: a FIFO here used to block the scheduler.
            prompt = read_regular_file(path, HEARTBEAT_MAX_BYTES).decode("utf-8-sig").strip()
        except (OSError, UnicodeError) as exc:
            problem = f"cannot read the heartbeat file {path}: {exc}"
        else:
            if prompt:
                if self._file_problem is not None:
                    log.info("heartbeat file %s is readable again", path)
                self._file_problem = None
                return prompt
            problem = f"the heartbeat file {path} is empty"
        if problem != self._file_problem:  # once per problem, not once per tick
            log.warning(
                "heartbeat %s skipped: %s; it runs once the file is fixed", job.name, problem
            )
        self._file_problem = problem
        return None

    def _answered(self, session: str, job: str | None = None) -> str | None:
        """Forget one job sent on ``session`` (``job``, or the oldest); returns its name."""
        queue = self._running.get(session)
        if not queue:
            return job
        if job is None:
            job = queue.popleft()
        elif job in queue:
            queue.remove(job)
        if not queue:
            del self._running[session]
        return job

    def _status(self) -> SchedulerStatus:
        now = self._now()
        return SchedulerStatus(
            jobs=self.schedule.names,
            last_runs=dict(self.last_runs),
            next_wake=self.schedule.next_wake(now, self.last_runs, self.first_seen),
            sent=self.sent,
            runs=self.runs,
            skips=self.skips,
            failures=self.failures,
            running=tuple(name for queue in self._running.values() for name in queue),
        )

    # --- time and state ---

    def _now(self) -> datetime:
        return as_utc(self.clock())

    def _load(self) -> None:
        if self.state_store is not None:
            try:
                last_runs, first_seen = self.state_store.load()
            except Exception as exc:
                # Start empty but never save over a state we could not read.
                self._saving = False
                log.error("cannot read the scheduler state from the store (%s); not saving", exc)
                return
            self.last_runs = {name: as_utc(at) for name, at in last_runs.items()}
            self.first_seen = {name: as_utc(at) for name, at in first_seen.items()}
            return
        path = self.state_path
        try:
            state = _read_state(path)
        except _CorruptState as exc:
            state = _State()
            try:
                aside = _aside_path(path)
                os.replace(path, aside)
            except OSError as move_exc:
                # Saving now would overwrite the only copy: keep the file, do not save.
                self._saving = False
                log.error(
                    "the scheduler state %s is corrupt (%s) and cannot be moved aside (%s); "
                    "starting empty and not saving until it is fixed",
                    path,
                    exc,
                    move_exc,
                )
            else:
                log.warning(
                    "the scheduler state %s is corrupt (%s); kept it as %s and started empty",
                    path,
                    exc,
                    aside,
                )
        except OSError as exc:
            state = _State()
            self._saving = False
            log.error(
                "cannot read the scheduler state %s (%s); starting empty and not saving", path, exc
            )
        self.last_runs = dict(state.last_runs)
        self.first_seen = dict(state.first_seen)

    def _save(self) -> None:
        if not self._saving:
            return
        if self.state_store is not None:
            try:
                self.state_store.save(dict(self.last_runs), dict(self.first_seen))
            except Exception as exc:
                log.warning("cannot save the scheduler state to the store: %s", exc)
            return
        state = _State(last_runs=dict(self.last_runs), first_seen=dict(self.first_seen))
        try:
            _write_state(self.state_path, state)
        except OSError as exc:
            log.warning("cannot save the scheduler state to %s: %s", self.state_path, exc)


def _tick_loop(
    ref: pykka.ActorRef[Any], every: float, stop: threading.Event, waiting: threading.Event
) -> None:
    """Tell ``ref`` a ``Tick()`` every ``every`` seconds until ``stop`` is set or it dies.

    A tick is not told while the previous one still waits in the mailbox, so a slow scheduler
    does not pile ticks up.
    """
    while not stop.wait(every):
        if waiting.is_set():
            continue
        waiting.set()
        try:
            ref.tell(Tick())
        except pykka.ActorDeadError:
            return
