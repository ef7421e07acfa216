"""The schedule: which ``[[cron]]`` and ``[heartbeat]`` jobs are due, and when the next one is.

:class:`Schedule` is a pure planner: given the time and what ran when, it says which jobs are
due and when the next one will be. No threads, no I/O, no clock of its own. The scheduler actor
(:class:`~actors.services.scheduler.SchedulerActor`) owns the clock and the state file, and asks
it on each tick.

A missed run is caught up once, however many fire times the downtime covered: a job is due when
its latest fire time is later than its last run, and running it moves the last run to now.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter

from actors.core.config import Config, CronJob, HeartbeatConfig
from actors.core.dispatch import clock_text

__all__ = [
    "CronEntry",
    "HeartbeatEntry",
    "Job",
    "Schedule",
    "as_utc",
    "cron_job_name",
    "heartbeat_job_name",
    "scheduled_text",
]

_MINUTE = timedelta(minutes=1)
_EPSILON = timedelta(microseconds=1)


def cron_job_name(index: int, session: str) -> str:
    """The name of the ``[[cron]]`` entry at ``index`` (from 0, in file order):
    ``cron:<index>:<session>``."""
    return f"cron:{index}:{session}"


def heartbeat_job_name(session: str) -> str:
    """The name of the heartbeat job: ``heartbeat:<session>``."""
    return f"heartbeat:{session}"


def scheduled_text(now: datetime, prompt: str) -> str:
    """The user text of a scheduled turn: ``It is <now>.`` then a blank line then ``prompt``."""
    return f"It is {clock_text(now)}.\n\n{prompt}"


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (a naive one is taken to be UTC already)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _latest_fire(expression: str, now: datetime) -> datetime:
    """The latest fire time of ``expression`` at or before ``now``.

    croniter's ``get_prev`` is strictly before its start; five-field cron fires on whole minutes,
    so starting from the minute after ``now``'s minute finds a fire time equal to it too.
    """
    start = now.replace(second=0, microsecond=0) + _MINUTE
    fire: datetime = croniter(expression, start).get_prev(datetime)
    return as_utc(fire)


def _next_fire(expression: str, after: datetime, *, inclusive: bool) -> datetime:
    """The first fire time of ``expression`` later than ``after`` (or equal, if inclusive)."""
    start = after - _EPSILON if inclusive else after
    fire: datetime = croniter(expression, start).get_next(datetime)
    return as_utc(fire)


@dataclass(frozen=True, slots=True)
class CronEntry:
    """A ``[[cron]]`` job as the planner sees it."""

    name: str
    """``cron:<index>:<session>``."""
    session: str
    """The session the turn runs in."""
    schedule: str
    """The five-field cron expression, in UTC."""
    prompt: str
    """The text after the ``It is <now>.`` line."""
    agent: str | None = None
    """The agent profile the turn runs (None: ``default``)."""


@dataclass(frozen=True, slots=True)
class HeartbeatEntry:
    """The ``[heartbeat]`` job as the planner sees it."""

    name: str
    """``heartbeat:<session>``."""
    session: str
    """The session the turn runs in."""
    every: timedelta
    """The time between two runs."""
    file: str
    """The prompt file, relative to ``home`` (or absolute); read at each run."""


Job = CronEntry | HeartbeatEntry
"""One scheduled job."""


class Schedule:
    """The pure planner of scheduled jobs: what is due at a time, and when the next thing is.

    It holds the jobs and nothing else. Callers pass what it needs: ``now``, the last run of each
    job (``last_runs``, by job name), and when each job was first seen (``first_seen``). Times
    are compared in UTC; a naive datetime is taken to be UTC.

    - A cron job that has run is due when its latest fire time at or before ``now`` is later than
      its last run. However many fire times a downtime covered, that is one due run.
    - A cron job that never ran is due from its first fire time at or after it was first seen,
      so a fresh start does not fire for a time that passed before the scheduler knew the job.
      With no ``first_seen`` entry it counts as first seen at ``now``.
    - The heartbeat is due at once if it never ran, then when ``every_s`` has passed since its
      last run (or if its last run is in the future: the clock was set back).
    """

    def __init__(self, cron: Iterable[CronJob] = (), heartbeat: HeartbeatConfig | None = None):
        """Plan the ``[[cron]]`` entries ``cron`` (named by position) and ``heartbeat``."""
        jobs: list[Job] = [
            CronEntry(
                cron_job_name(i, job.session), job.session, job.schedule, job.prompt, job.agent
            )
            for i, job in enumerate(cron)
        ]
        if heartbeat is not None:
            every = timedelta(seconds=heartbeat.every_s)
            name = heartbeat_job_name(heartbeat.session)
            jobs.append(HeartbeatEntry(name, heartbeat.session, every, heartbeat.file))
        self.jobs: tuple[Job, ...] = tuple(jobs)
        """Every job, cron jobs in file order, then the heartbeat."""
        self._by_name = {job.name: job for job in self.jobs}

    @classmethod
    def from_config(cls, config: Config) -> Schedule:
        """The schedule of ``config.cron`` and ``config.heartbeat``."""
        return cls(config.cron, config.heartbeat)

    @property
    def names(self) -> tuple[str, ...]:
        """Every job's name, in order."""
        return tuple(job.name for job in self.jobs)

    def job(self, name: str) -> Job:
        """The job called ``name``; ``KeyError`` if there is none."""
        return self._by_name[name]

    def mark_seen(
        self,
        now: datetime,
        last_runs: Mapping[str, datetime],
        first_seen: Mapping[str, datetime],
    ) -> dict[str, datetime]:
        """``first_seen`` plus ``now`` for every cron job neither run nor seen before."""
        seen = dict(first_seen)
        for job in self.jobs:
            if isinstance(job, CronEntry) and job.name not in last_runs and job.name not in seen:
                seen[job.name] = as_utc(now)
        return seen

    def next_due(
        self,
        name: str,
        now: datetime,
        last_runs: Mapping[str, datetime],
        first_seen: Mapping[str, datetime] | None = None,
    ) -> datetime:
        """The earliest time job ``name`` is due; at or before ``now`` means it is due now."""
        now = as_utc(now)
        job = self.job(name)
        last = last_runs.get(name)
        if isinstance(job, HeartbeatEntry):
            if last is None:
                return now
            last = as_utc(last)
            return now if last > now else last + job.every
        if last is not None:
            return _next_fire(job.schedule, as_utc(last), inclusive=False)
        seen = (first_seen or {}).get(name)
        return _next_fire(job.schedule, now if seen is None else as_utc(seen), inclusive=True)

    def is_due(
        self,
        name: str,
        now: datetime,
        last_runs: Mapping[str, datetime],
        first_seen: Mapping[str, datetime] | None = None,
    ) -> bool:
        """True if job ``name`` is due at ``now`` (see the class for the rules)."""
        now = as_utc(now)
        job = self.job(name)
        if isinstance(job, HeartbeatEntry):
            return self.next_due(name, now, last_runs, first_seen) <= now
        latest = _latest_fire(job.schedule, now)
        last = last_runs.get(name)
        if last is not None:
            return latest > as_utc(last)
        seen = (first_seen or {}).get(name)
        return latest >= (now if seen is None else as_utc(seen))

    def due(
        self,
        now: datetime,
        last_runs: Mapping[str, datetime],
        first_seen: Mapping[str, datetime] | None = None,
    ) -> list[str]:
        """The names of the jobs due at ``now``, in job order. Each is due once, not once per
        fire time it missed."""
        return [job.name for job in self.jobs if self.is_due(job.name, now, last_runs, first_seen)]

    def next_wake(
        self,
        now: datetime,
        last_runs: Mapping[str, datetime],
        first_seen: Mapping[str, datetime] | None = None,
    ) -> datetime | None:
        """The earliest time a job is due: ``now`` if one is due already, None with no jobs."""
        if not self.jobs:
            return None
        now = as_utc(now)
        earliest = min(self.next_due(job.name, now, last_runs, first_seen) for job in self.jobs)
        return max(earliest, now)
