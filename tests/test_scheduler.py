"""The scheduler: the planner's rules, and scheduled turns through real actors.

Nothing here sleeps: the scheduler runs with ``tick_s=None`` and is driven by ``Tick(now=...)``
and a fake clock. Waiting is only ever for a message (a probe's ``expect``) or an ``ask``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.core.config import AgentConfig, Config, ConfigError, CronJob, HeartbeatConfig
from actors.core.schedule import Schedule, scheduled_text
from actors.dispatcher.directory import CONTEXT, Directory, session_address
from actors.runtime import Runtime
from actors.services.scheduler import SCHEDULER, SchedulerActor, SchedulerStatus
from actors.stores.reader import StoreReader
from actors.stores.sqlite import DB_NAME
from actors.testing import Probe, call, reply
from actors.testing.script import Answer
from messages import (
    FailReason,
    Inspect,
    JobSkipped,
    ModelRequest,
    ScheduledTurn,
    StartTurn,
    Tick,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
)
from messages.base import Message


class HeldByHand(StartTurn, frozen=True):
    """A ``StartTurn`` on a child's id, past the check every door makes (children are opened
    only by their parents). No user can send one any more; it stands for the one way a child's
    id is held with no turn of its parent around it: a child still winding down after its
    parent's call was answered (``loop.child_timeout_s``)."""

    def __post_init__(self) -> None:
        Message.__post_init__(self)


WAIT = 10.0
T0 = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)  # a Monday
"""07:00 UTC: the fire time of the ``0 7 * * *`` jobs below."""
MORNING = CronJob(session="ops", schedule="0 7 * * *", prompt="Read the overnight notes.")
HOURLY = CronJob(session="ops", schedule="0 * * * *", prompt="Check the queue.")


def at(hour: int, minute: int = 0, second: int = 0, *, day: int = 30, month: int = 11) -> datetime:
    """A time in 2026, in UTC; Monday 30 November unless told otherwise."""
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def user_text(request: ModelRequest) -> str:
    """The text of the last user message of ``request``."""
    users = [m for m in request.messages if m.role == "user"]
    return users[-1].content or ""


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Callable[..., pykka.ActorRef[Any]]]:
    """A factory of started SchedulerActors (``tick_s=None``), each stopped when the test ends."""
    started: list[pykka.ActorRef[Any]] = []

    def start(
        config: Config,
        directory: Directory,
        clock: Callable[[], datetime],
        *,
        state_path: Path | None = None,
        tick_s: float | None = None,
        state_store: Any = None,
    ) -> pykka.ActorRef[Any]:
        path = state_path if state_path is not None else tmp_path / "scheduler.json"
        ref = SchedulerActor.start(
            config, directory, clock, state_path=path, tick_s=tick_s, state_store=state_store
        )
        started.append(ref)
        return ref

    yield start
    for ref in started:
        if ref.is_alive():
            ref.stop()


# The state's restart tests run on the state file and, in `tox -e cluster` (which has a
# PostgreSQL server), on the shared store's table too.
STATE_BACKENDS = ["file", *(["postgresql"] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else [])]


@pytest.fixture(params=STATE_BACKENDS)
def state_store(request: pytest.FixtureRequest) -> Any:
    """Where a restarted scheduler finds its state: None (the file) or a PostgreSQL store."""
    if request.param == "file":
        return None
    from actors.stores.postgres import PgSchedulerState

    return PgSchedulerState(request.getfixturevalue("pg_database")())


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event a scripted model blocks on to hold a session; set when the test ends."""
    event = threading.Event()
    yield event
    event.set()


def status(ref: pykka.ActorRef[Any]) -> SchedulerStatus:
    """The scheduler's status (asked, so every message told before has been handled)."""
    answer = ref.ask(Inspect(), timeout=WAIT)
    assert isinstance(answer, SchedulerStatus)
    return answer


def tick(ref: pykka.ActorRef[Any], now: datetime | None = None) -> None:
    """Tick the scheduler and wait until it has handled the tick (its turns are sent)."""
    ref.ask(Tick(now), timeout=WAIT)


def settle(rt: Runtime, events: Probe, session: str) -> None:
    """Wait until ``session``'s turn has ended and the Context has answered for it.

    The session tells the Context its outcome in the same step it emits ``TurnEnded``; asking
    the session and then the Context waits until both have handled what came before.
    """
    events.expect(lambda e: isinstance(e, TurnEnded) and e.session == session, WAIT)
    ref = rt.directory.get(session_address(session))
    assert isinstance(ref, pykka.ActorRef)
    ref.ask(Inspect(), timeout=WAIT)
    rt.context.ask(Inspect(), timeout=WAIT)


# --- the planner ------------------------------------------------------------------------------


def test_job_names_follow_the_config() -> None:
    beat = HeartbeatConfig(session="watch", every_s=60)
    schedule = Schedule([MORNING, msgspec.structs.replace(HOURLY, session="b")], beat)
    assert schedule.names == ("cron:0:ops", "cron:1:b", "heartbeat:watch")
    assert Schedule.from_config(Config(home="/tmp/x", heartbeat=beat)).names == ("heartbeat:watch",)


def test_a_cron_job_fires_at_its_times_in_utc() -> None:
    schedule = Schedule([CronJob(session="ops", schedule="0 7 * * 1-5", prompt="p")])
    seen = {"cron:0:ops": at(6)}
    assert schedule.due(at(6, 59, 59), {}, seen) == []
    assert schedule.due(at(7), {}, seen) == ["cron:0:ops"]
    assert schedule.due(at(7, 0, 30), {}, seen) == ["cron:0:ops"]
    # The same instant written in another zone is the same fire time.
    paris = timezone(timedelta(hours=1))
    assert schedule.due(datetime(2026, 11, 30, 8, 0, tzinfo=paris), {}, seen) == ["cron:0:ops"]
    assert schedule.due(datetime(2026, 11, 30, 7, 0, tzinfo=paris), {}, seen) == []
    # Once run, not again until the next fire time: Tuesday 07:00; Saturday has none.
    ran = {"cron:0:ops": at(7, 0, 1)}
    assert schedule.due(at(7, 0, 30), ran, seen) == []
    assert schedule.due(at(6, 59, day=1, month=12), ran, seen) == []
    assert schedule.due(at(7, day=1, month=12), ran, seen) == ["cron:0:ops"]
    friday_run = {"cron:0:ops": at(7, 0, 1, day=4, month=12)}
    assert schedule.due(at(7, day=5, month=12), friday_run, seen) == []
    assert schedule.due(at(7, day=6, month=12), friday_run, seen) == []
    assert schedule.due(at(7, day=7, month=12), friday_run, seen) == ["cron:0:ops"]


def test_a_naive_time_is_taken_as_utc() -> None:
    schedule = Schedule([MORNING])
    seen = {"cron:0:ops": at(6)}
    assert schedule.due(datetime(2026, 11, 30, 7, 0), {}, seen) == ["cron:0:ops"]


def test_a_fresh_start_does_not_fire_for_a_time_that_passed_before_it() -> None:
    schedule = Schedule([MORNING])
    seen = schedule.mark_seen(at(7, 30), {}, {})
    assert seen == {"cron:0:ops": at(7, 30)}
    assert schedule.due(at(7, 30), {}, seen) == []
    assert schedule.due(at(23, 59), {}, seen) == []
    assert schedule.next_due("cron:0:ops", at(7, 30), {}, seen) == at(7, day=1, month=12)
    # A fire time between being first seen and the first tick is caught up.
    assert schedule.due(at(9), {}, {"cron:0:ops": at(6, 30)}) == ["cron:0:ops"]
    # Without a first-seen entry the job counts as first seen now.
    assert schedule.due(at(7, 30), {}, {}) == []
    assert schedule.due(at(7), {}, {}) == ["cron:0:ops"]
    # mark_seen keeps what it knew and leaves jobs that have run alone.
    assert schedule.mark_seen(at(9), {}, seen) == seen
    assert schedule.mark_seen(at(9), {"cron:0:ops": at(7)}, {}) == {}


def test_missed_runs_after_a_long_downtime_are_one_run() -> None:
    schedule = Schedule([HOURLY])
    name = "cron:0:ops"
    three_days_ago = {name: at(7) - timedelta(days=3)}
    now = at(7, 20)
    assert schedule.due(now, three_days_ago) == [name]
    # Running it once (the last run becomes now) catches everything up.
    assert schedule.due(now, {name: now}) == []
    assert schedule.due(at(7, 59, 59), {name: now}) == []
    assert schedule.due(at(8), {name: now}) == [name]
    assert schedule.next_due(name, now, {name: now}) == at(8)


def test_the_heartbeat_runs_at_once_then_every_every_s() -> None:
    schedule = Schedule(heartbeat=HeartbeatConfig(session="watch", every_s=1800))
    name = "heartbeat:watch"
    assert schedule.due(T0, {}) == [name]
    last = {name: T0}
    assert schedule.due(T0 + timedelta(seconds=1799), last) == []
    assert schedule.due(T0 + timedelta(seconds=1800), last) == [name]
    assert schedule.due(T0 + timedelta(days=2), last) == [name]  # one run, not 96
    assert schedule.next_due(name, T0, last) == T0 + timedelta(seconds=1800)
    # A last run in the future means the clock was set back: run rather than wait for it.
    assert schedule.due(T0, {name: T0 + timedelta(hours=5)}) == [name]


def test_next_wake_is_the_earliest_due_time() -> None:
    beat = HeartbeatConfig(session="watch", every_s=600)
    schedule = Schedule([MORNING, msgspec.structs.replace(HOURLY, session="q")], beat)
    assert Schedule().next_wake(T0, {}) is None
    assert Schedule().due(T0, {}) == []
    seen = {"cron:0:ops": at(6, 30), "cron:1:q": at(6, 30)}
    last = {"heartbeat:watch": at(6, 45)}
    assert schedule.next_wake(at(6, 50), last, seen) == at(6, 55)
    last = {"heartbeat:watch": at(6, 58)}
    assert schedule.next_wake(at(6, 59), last, seen) == at(7)
    # Something due already: the wake is now.
    assert schedule.next_wake(at(7, 0, 20), last, seen) == at(7, 0, 20)
    assert schedule.next_wake(at(7, 0, 20), {}, seen) == at(7, 0, 20)


# --- the actor, against a probe standing at the Context's address -------------------------------


@pytest.fixture
def context_probe() -> Iterator[tuple[Directory, Probe]]:
    """A directory whose ``context`` address is a probe."""
    directory = Directory()
    probe = Probe.start(directory, "fake-context")
    directory.register(CONTEXT, probe)
    yield directory, probe
    probe.stop()


def test_a_due_job_is_told_to_the_context_as_a_scheduled_turn(
    tmp_path, scheduler, context_probe
) -> None:
    directory, context = context_probe
    config = Config(home=str(tmp_path / "home"), cron=(MORNING,))
    clock = FakeClock(at(6, 59))
    ref = scheduler(config, directory, clock)
    assert directory.get(SCHEDULER) is not None
    tick(ref)
    context.expect_none(0.05)
    clock.now = at(7, 0, 1)
    tick(ref)  # no ``now`` on the tick: the clock's time
    turn = context.expect(ScheduledTurn)
    assert turn == ScheduledTurn(
        job="cron:0:ops",
        session="ops",
        text="It is 2026-11-30T07:00:01Z.\n\nRead the overnight notes.",
        reply_to="scheduler",
    )
    assert turn.text == scheduled_text(at(7, 0, 1), MORNING.prompt)
    tick(ref, at(7, 0, 2))
    context.expect_none(0.05)
    st = status(ref)
    assert st.sent == 1 and st.running == ("cron:0:ops",)
    assert st.last_runs == {"cron:0:ops": at(7, 0, 1)}
    assert st.next_wake == at(7, day=1, month=12)


def test_answers_are_counted(tmp_path, scheduler, context_probe) -> None:
    directory, context = context_probe
    beat = HeartbeatConfig(session="watch", every_s=60)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "HEARTBEAT.md").write_text("Look around.")
    config = Config(home=str(tmp_path / "home"), cron=(MORNING,), heartbeat=beat)
    ref = scheduler(config, directory, FakeClock(at(6)))
    tick(ref, at(7))
    assert [t.job for t in context.expect_all(ScheduledTurn, 2)] == [
        "cron:0:ops",
        "heartbeat:watch",
    ]
    ref.tell(JobSkipped(session="ops", job="cron:0:ops", held=("ops",)))
    ref.tell(TurnFailed("watch", FailReason.MODEL_ERROR, "down"))
    st = status(ref)
    assert (st.sent, st.runs, st.skips, st.failures, st.running) == (2, 0, 1, 1, ())
    tick(ref, at(7, 1))
    context.expect(ScheduledTurn)
    ref.tell(TurnCompleted("watch", "all quiet"))
    st = status(ref)
    assert (st.sent, st.runs, st.skips, st.failures, st.running) == (3, 1, 1, 1, ())
    # The status is a message like any other.
    assert msgspec.json.decode(msgspec.json.encode(st), type=SchedulerStatus) == st


def test_a_missing_heartbeat_file_skips_the_run_and_records_nothing(
    tmp_path, scheduler, context_probe, caplog
) -> None:
    directory, context = context_probe
    home = tmp_path / "home"
    beat = HeartbeatConfig(session="watch", every_s=60, file="beat/PROMPT.md")
    ref = scheduler(Config(home=str(home), heartbeat=beat), directory, FakeClock(T0))
    with caplog.at_level(logging.WARNING, logger="actors.services.scheduler"):
        tick(ref, T0)
        tick(ref, T0 + timedelta(seconds=1))
    context.expect_none(0.05)
    assert status(ref).last_runs == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once, not once per tick
    assert "heartbeat:watch skipped" in warnings[0]
    assert str(home / "beat" / "PROMPT.md") in warnings[0]
    # An empty file is skipped the same way.
    (home / "beat").mkdir(parents=True)
    (home / "beat" / "PROMPT.md").write_text("  \n")
    tick(ref, T0 + timedelta(seconds=2))
    context.expect_none(0.05)
    # Once the file is there, the next tick runs the heartbeat.
    (home / "beat" / "PROMPT.md").write_text("Anything new?\n")
    tick(ref, T0 + timedelta(seconds=3))
    turn = context.expect(ScheduledTurn)
    assert turn.text == "It is 2026-11-30T07:00:03Z.\n\nAnything new?"
    assert status(ref).last_runs == {"heartbeat:watch": T0 + timedelta(seconds=3)}


def test_a_corrupt_state_file_is_kept_aside_and_the_scheduler_starts_empty(
    tmp_path, scheduler, context_probe, caplog
) -> None:
    directory, context = context_probe
    state = tmp_path / "state" / "scheduler.json"
    state.parent.mkdir()
    state.write_text('{"version": 1, "last_runs": {"cron:0:ops": "yesterday')
    config = Config(home=str(tmp_path / "home"), cron=(MORNING,))
    with caplog.at_level(logging.WARNING, logger="actors.services.scheduler"):
        ref = scheduler(config, directory, FakeClock(at(6)), state_path=state)
        st = status(ref)
    assert st.last_runs == {}
    aside = state.with_name("scheduler.json.corrupt")
    assert aside.read_text() == '{"version": 1, "last_runs": {"cron:0:ops": "yesterday'
    assert any("corrupt" in r.getMessage() and str(aside) in r.getMessage() for r in caplog.records)
    tick(ref, at(7))
    assert context.expect(ScheduledTurn).job == "cron:0:ops"
    ref.stop()
    # A second corrupt file does not overwrite the first one kept aside.
    state.write_text("[]")
    ref = scheduler(config, directory, FakeClock(at(6)), state_path=state)
    assert status(ref).last_runs == {}
    assert aside.read_text().endswith("yesterday")
    assert state.with_name("scheduler.json.corrupt.1").read_text() == "[]"


def test_the_state_file_is_plain_json_with_no_temporary_left(
    tmp_path, scheduler, context_probe
) -> None:
    directory, _ = context_probe
    state = tmp_path / "scheduler.json"
    config = Config(home=str(tmp_path / "home"), cron=(MORNING,))
    ref = scheduler(config, directory, FakeClock(at(6)), state_path=state)
    tick(ref, at(7))
    saved = msgspec.json.decode(state.read_bytes())
    assert saved["last_runs"] == {"cron:0:ops": "2026-11-30T07:00:00Z"}
    assert saved["first_seen"] == {"cron:0:ops": "2026-11-30T06:00:00Z"}
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["scheduler.json"]


def test_the_tick_thread_ticks_and_stops_with_the_actor(tmp_path, scheduler, context_probe) -> None:
    directory, context = context_probe
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "HEARTBEAT.md").write_text("Tick tock.")
    beat = HeartbeatConfig(session="watch", every_s=3600)
    config = Config(home=str(tmp_path / "home"), heartbeat=beat)
    before = set(threading.enumerate())
    ref = scheduler(config, directory, FakeClock(T0), tick_s=0.01)
    assert context.expect(ScheduledTurn, WAIT).job == "heartbeat:watch"
    [ticker] = [t for t in set(threading.enumerate()) - before if t.name == "loopd-scheduler-tick"]
    assert ticker.daemon
    ref.stop()
    assert not ticker.is_alive()
    assert directory.get(SCHEDULER) is None


def test_tick_s_must_be_positive(tmp_path) -> None:
    with pytest.raises(ValueError, match="tick_s"):
        SchedulerActor(
            Config(home=str(tmp_path)), Directory(), FakeClock(T0), state_path=tmp_path, tick_s=0
        )


# --- with a real runtime ----------------------------------------------------------------------


def scripted(gate: threading.Event, *, blocked: tuple[str, ...] = ()) -> Callable[..., Answer]:
    """A model script: sessions in ``blocked`` (and every child) wait for ``gate``; a session
    whose text asks for a child calls ``subagent``; everyone else answers ``ok``."""

    def answer(request: ModelRequest) -> Answer:
        session = request.session
        if session in blocked or session.startswith("sub-"):
            gate.wait(WAIT)
            return reply("released")
        if any(m.role == "tool" for m in request.messages):
            return reply("the child answered")
        if "spawn a child" in user_text(request):
            return call("subagent", task="dig deeper")
        return reply("ok")

    return answer


def test_a_cron_job_starts_a_turn_with_the_time_and_its_prompt(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    config = loopd_config.replace(cron=(MORNING,))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    sched = scheduler(config, rt.directory, FakeClock(at(6, 30)))
    tick(sched, at(6, 59, 59))
    tick(sched, T0)
    settle(rt, events, "ops")
    [request] = rt.model.requests
    assert request.session == "ops"
    assert user_text(request) == "It is 2026-11-30T07:00:00Z.\n\nRead the overnight notes."
    st = status(sched)
    assert (st.sent, st.runs, st.skips, st.failures) == (1, 1, 0, 0)


def test_a_cron_job_runs_the_agent_profile_it_names(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    # Issue 19 B4: the job's turn runs that profile, as run_turn(agent=...) picks it.
    night = CronJob(session="ops", schedule="0 7 * * *", prompt="Sum up.", agent="night")
    profile = AgentConfig(model="night-model", system="You sum up the night.")
    config = loopd_config.replace(cron=(night, MORNING), agents={"night": profile})
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    sched = scheduler(config, rt.directory, FakeClock(at(6, 30)))
    tick(sched, T0)  # both jobs are due: the night job on ops, then MORNING, skipped (ops held)
    settle(rt, events, "ops")
    [request] = rt.model.requests
    assert (request.session, request.agent, request.options.model) == (
        "ops",
        "night",
        "night-model",
    )
    assert request.messages[0].content == "You sum up the night."
    with StoreReader(config.home_path / DB_NAME) as store:
        assert store.open("ops").agent == "night"
    st = status(sched)
    assert (st.sent, st.runs, st.skips) == (2, 1, 1)


def test_a_cron_job_tells_the_context_its_agent(tmp_path, scheduler, context_probe) -> None:
    directory, context = context_probe
    job = CronJob(session="ops", schedule="0 7 * * *", prompt="go", agent="night")
    config = Config(home=str(tmp_path / "home"), cron=(job,), agents={"night": AgentConfig()})
    ref = scheduler(config, directory, FakeClock(at(6, 59)))
    tick(ref, T0)
    assert context.expect(ScheduledTurn).agent == "night"


def test_a_cron_job_naming_an_unknown_agent_is_refused_at_load(tmp_path) -> None:
    text = '[agents.day]\n\n[[cron]]\nsession = "ops"\nschedule = "0 7 * * *"\nprompt = "go"\n'
    (tmp_path / "loopd.toml").write_text(text + 'agent = "night"\n')
    with pytest.raises(ConfigError, match=r"cron\[0\]\.agent .*ops.*'night'.*default, day"):
        Config.load(tmp_path / "loopd.toml")
    (tmp_path / "loopd.toml").write_text(text + 'agent = "day"\n')
    assert Config.load(tmp_path / "loopd.toml").cron[0].agent == "day"


def test_the_heartbeat_reads_its_file_at_each_run(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    config = loopd_config.replace(heartbeat=HeartbeatConfig(session="watch", every_s=300))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    prompt = config.home_path / "HEARTBEAT.md"
    prompt.write_text("Check the inbox.")
    sched = scheduler(config, rt.directory, FakeClock(T0))
    tick(sched, T0)
    settle(rt, events, "watch")
    prompt.write_text("Check the calendar.")
    tick(sched, T0 + timedelta(seconds=299))
    tick(sched, T0 + timedelta(seconds=300))
    settle(rt, events, "watch")
    texts = [user_text(r) for r in rt.model.requests]
    assert texts == [
        "It is 2026-11-30T07:00:00Z.\n\nCheck the inbox.",
        "It is 2026-11-30T07:05:00Z.\n\nCheck the calendar.",
    ]
    assert status(sched).runs == 2


def test_a_job_is_skipped_while_its_session_is_held(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    config = loopd_config.replace(cron=(MORNING,))
    rt = loopd_runtime(scripted(gate, blocked=("ops",)), config=config)
    events = probe()
    rt.subscribe(events.tell)
    sched = scheduler(config, rt.directory, FakeClock(at(6)))
    rt.send_turn("ops", "a long job")
    rt.model.wait_for_requests(1, WAIT)
    tick(sched, T0)
    skipped = events.expect(JobSkipped, WAIT)
    assert (skipped.job, skipped.session, skipped.held) == ("cron:0:ops", "ops", ("ops",))
    rt.context.ask(Inspect(), timeout=WAIT)  # the Context has told the scheduler too
    st = status(sched)
    assert (st.sent, st.skips, st.runs, st.running) == (1, 1, 0, ())
    gate.set()
    settle(rt, events, "ops")
    assert len(rt.model.requests) == 1  # the job never reached the model
    # Skipped counts as this fire time's run: the next one is tomorrow.
    tick(sched, at(7, 30))
    assert status(sched).sent == 1


def test_a_job_is_skipped_while_a_descendant_of_its_session_is_held(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    config = loopd_config.replace(cron=(MORNING,))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    sched = scheduler(config, rt.directory, FakeClock(at(6)))
    rt.context.tell(HeldByHand("sub-ops-1", "held by hand"))
    rt.model.wait_for_requests(1, WAIT)
    tick(sched, T0)
    skipped = events.expect(JobSkipped, WAIT)
    assert (skipped.session, skipped.held) == ("ops", ("sub-ops-1",))
    assert not any(r.session == "ops" for r in rt.model.requests)


def test_a_heartbeat_does_not_pile_onto_a_session_waiting_for_its_child(
    loopd_runtime, loopd_config, scheduler, probe, gate
) -> None:
    config = loopd_config.replace(heartbeat=HeartbeatConfig(session="hb", every_s=60))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    (config.home_path / "HEARTBEAT.md").write_text("Please spawn a child.")
    sched = scheduler(config, rt.directory, FakeClock(T0))
    tick(sched, T0)
    requests = rt.model.wait_for_requests(2, WAIT)  # the parent's, then its child's
    assert [r.session for r in requests] == ["hb", "sub-hb-1"]
    tick(sched, T0 + timedelta(seconds=60))
    skipped = events.expect(JobSkipped, WAIT)
    assert (skipped.job, skipped.session, skipped.held) == (
        "heartbeat:hb",
        "hb",
        ("hb", "sub-hb-1"),
    )
    gate.set()
    settle(rt, events, "hb")
    assert [r.session for r in rt.model.requests] == ["hb", "sub-hb-1", "hb"]
    st = status(sched)
    assert (st.sent, st.runs, st.skips) == (2, 1, 1)


def test_the_state_survives_a_scheduler_restart(
    loopd_runtime, loopd_config, scheduler, probe, tmp_path, gate, state_store
) -> None:
    config = loopd_config.replace(cron=(MORNING,))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    state = tmp_path / "scheduler.json"
    first = scheduler(
        config, rt.directory, FakeClock(at(6)), state_path=state, state_store=state_store
    )
    tick(first, T0)
    settle(rt, events, "ops")
    first.stop()
    assert rt.directory.get(SCHEDULER) is None
    second = scheduler(
        config, rt.directory, FakeClock(at(7, 0, 30)), state_path=state, state_store=state_store
    )
    assert status(second).last_runs == {"cron:0:ops": T0}
    tick(second, at(7, 0, 30))
    assert status(second).sent == 0
    assert len(rt.model.requests) == 1
    # The next day's run still happens.
    tick(second, at(7, day=1, month=12))
    settle(rt, events, "ops")
    assert user_text(rt.model.requests[-1]).startswith("It is 2026-12-01T07:00:00Z.")


def test_a_run_missed_while_the_scheduler_was_down_is_caught_up_once(
    loopd_runtime, loopd_config, scheduler, probe, tmp_path, gate, state_store
) -> None:
    config = loopd_config.replace(cron=(HOURLY,))
    rt = loopd_runtime(scripted(gate), config=config)
    events = probe()
    rt.subscribe(events.tell)
    state = tmp_path / "scheduler.json"
    first = scheduler(
        config, rt.directory, FakeClock(at(6, 30)), state_path=state, state_store=state_store
    )
    tick(first, T0)
    settle(rt, events, "ops")
    first.stop()
    # Down for three days; back at 07:20 on the third day.
    back = T0 + timedelta(days=3, minutes=20)
    second = scheduler(
        config, rt.directory, FakeClock(back), state_path=state, state_store=state_store
    )
    tick(second, back)
    tick(second, back + timedelta(seconds=1))
    settle(rt, events, "ops")
    assert status(second).sent == 1
    assert len(rt.model.requests) == 2
    assert user_text(rt.model.requests[-1]) == "It is 2026-12-03T07:20:00Z.\n\nCheck the queue."
