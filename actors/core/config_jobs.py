"""The scheduled jobs' tables: ``[[cron]]`` entries and the ``[heartbeat]``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar

from croniter import CroniterError, croniter
from msgspec import Meta

from actors.core.config_base import ConfigError, Section, check_path_text, check_top_level

__all__ = ["CronJob", "HeartbeatConfig"]


class CronJob(Section, frozen=True):
    """One ``[[cron]]`` entry: a turn on ``session`` with ``prompt`` at each ``schedule`` time."""

    _key: ClassVar[str] = "cron"

    session: str
    """The session the turn runs in."""
    schedule: str
    """A five-field cron expression, evaluated in UTC (``0 7 * * 1-5``)."""
    prompt: str
    """The turn's text, after the ``It is <now>.`` line."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_top_level(self.session, "cron.session")
        if len(self.schedule.split()) != 5 or not croniter.is_valid(self.schedule):
            raise ConfigError(f"cron.schedule: not a five-field cron expression: {self.schedule!r}")
        try:
            croniter(self.schedule, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
        except (CroniterError, ValueError):
            raise ConfigError(
                f"cron.schedule {self.schedule!r} can never fire (no such date: 31 February, say)"
            ) from None


class HeartbeatConfig(Section, frozen=True):
    """``[heartbeat]``: a turn on ``session`` every ``every_s`` seconds, prompted by ``file``."""

    _key: ClassVar[str] = "heartbeat"

    session: str
    """The session the turn runs in."""
    every_s: Annotated[float, Meta(gt=0)]
    """Seconds between two heartbeats."""
    file: str = "HEARTBEAT.md"
    """The prompt file, relative to ``home``; read afresh at each heartbeat."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_top_level(self.session, "heartbeat.session")
        check_path_text(self.file, "heartbeat.file")
