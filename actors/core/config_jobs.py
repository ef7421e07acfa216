"""The scheduled jobs' tables: ``[[cron]]`` entries and the ``[heartbeat]``, and the check of
a cron expression's five fields."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar

from croniter import CroniterError, croniter
from msgspec import Meta

from actors.core.config_base import ConfigError, Section, check_path_text, check_top_level

__all__ = ["CRON_FIELDS", "CronJob", "HeartbeatConfig", "check_cron_fields"]

CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
"""The five fields of a cron expression, in order: ``(name, lowest, highest)``."""

_NAMES = {
    3: ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    4: ("sun", "mon", "tue", "wed", "thu", "fri", "sat"),
}


def _field_value(text: str, index: int) -> int | None:
    """The number ``text`` names in field ``index`` (digits, or a month or day name); None
    for anything else (``L``, ``15W``, ``5#2``: croniter's own forms, checked by croniter)."""
    if text.isdecimal() and len(text) <= 4:  # longer: out of every range, no int() of 10^6 digits
        return int(text)
    if text.isdecimal():
        return 10_000
    names = _NAMES.get(index, ())
    low = CRON_FIELDS[index][1]
    return names.index(text.lower()) + low if text.lower() in names else None


def check_cron_fields(expression: str) -> str | None:
    """What is wrong with one of ``expression``'s five fields, naming it; None if nothing is.

    croniter accepts (and then misreads) a backward range (``1-0`` fires every minute, so does
    ``5-1`` as a day of week) and a step of any size (``*/1000000000000``). Here a range must run
    from low to high within its field, and a step must be from 1 to the count of the field's
    values (60 for minutes). Forms of croniter's own (``L``, ``15W``, ``5#2``) are left to it.
    """
    fields = expression.split()
    if len(fields) != 5:
        return f"it has {len(fields)} fields, not five (minute hour day-of-month month day-of-week)"
    for index, (text, (name, low, high)) in enumerate(zip(fields, CRON_FIELDS, strict=True)):
        for item in text.split(","):
            where = f"the {name} field {text!r}"
            base, slash, step = item.partition("/")
            if slash:
                count = high - low + 1
                steps = int(step) if step.isdecimal() and len(step) <= 4 else None
                if steps is None or not 1 <= steps <= count:
                    return f"{where}: its step {step!r} must be a whole number from 1 to {count}"
            first, dash, last = base.partition("-")
            for part in (first, last) if dash else (first,):
                value = _field_value(part, index)
                if value is not None and not low <= value <= high:
                    return f"{where}: {part!r} is not from {low} to {high}"
            start, end = _field_value(first, index), _field_value(last, index)
            if dash and start is not None and end is not None and start > end:
                top = 6 if index == 4 else high  # 7 is Sunday again, as 0 is
                wrapped = ",".join(
                    str(a) if a == b else f"{a}-{b}" for a, b in ((start, top), (low, end))
                )
                return (
                    f"{where}: its range {base!r} runs backwards; a range goes from low to high "
                    f"(to wrap around, write two: {wrapped})"
                )
    return None


class CronJob(Section, frozen=True):
    """One ``[[cron]]`` entry: a turn on ``session`` with ``prompt`` at each ``schedule`` time."""

    _key: ClassVar[str] = "cron"

    session: str
    """The session the turn runs in."""
    schedule: str
    """A five-field cron expression, evaluated in UTC (``0 7 * * 1-5``)."""
    prompt: str
    """The turn's text, after the ``It is <now>.`` line."""
    agent: str | None = None
    """The agent profile (``[agents.NAME]``) the job's session runs, as ``run_turn(agent=...)``
    picks it: a new session is created with it, a stored one of another profile fails the turn
    ``wrong_agent``. None: ``default``. The :class:`~actors.core.config.Config` refuses a name
    it has no profile of."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_top_level(self.session, "cron.session")
        wrong = check_cron_fields(self.schedule)
        if wrong is not None:
            raise ConfigError(
                f"cron.schedule {self.schedule!r} of the job on {self.session}: {wrong}"
            )
        if not croniter.is_valid(self.schedule):
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
