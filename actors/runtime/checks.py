"""What the facades check before anything is sent, and how they read an outcome back.

``Runtime``, ``AsyncRuntime`` and ``ClusterRuntime`` call these same functions, so a bad
session id, text, speaker, agent or timeout is refused the same way whichever facade is used.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from actors.core.config import Config, check_wait
from actors.core.dispatch import DEFAULT_AGENT
from messages import FailReason, StartTurn, ToolSpec, TurnFailed, TurnOutcome

__all__ = ["check_outcome", "check_turn", "output_kind", "turn_timed_out"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


def check_turn(
    config: Config,
    session: str,
    text: str,
    *,
    timeout: float | None = None,
    speaker: str | None = None,
    reply_to: str | None = None,
    agent: str | None = None,
    trace: dict[str, str] | None = None,
    output: ToolSpec | None = None,
) -> StartTurn:
    """The ``StartTurn`` that a facade's ``run_turn`` or ``send_turn`` asks for, every argument
    checked before anything is sent or stored.

    The one place for these checks, so that every facade (this process's, the cluster's)
    refuses the same calls with the same errors: ``ValueError`` for a ``timeout`` that is not
    None or a finite number of seconds above 0, an ``agent`` that ``config`` has no profile
    of, an invalid session id or a child's (``sub-...``), or text or a speaker that is not
    valid Unicode; ``TypeError`` for text that is not a ``str`` or a speaker that is neither
    ``str`` nor None.
    """
    check_wait(timeout, "timeout")
    if agent is not None and agent not in config.agent_names():
        names = ", ".join(config.agent_names())
        raise ValueError(f"no agent profile is named {agent!r} (the config has: {names})")
    return StartTurn(session, text, speaker, reply_to, agent, trace, output)


def check_outcome(outcome: TurnOutcome) -> TurnOutcome:
    """``outcome`` as ``run_turn`` returns it: a turn that named another agent or output
    schema than its stored session's is raised, ``ValueError`` with its detail, as the facades
    promise."""
    wrong = (FailReason.WRONG_AGENT, FailReason.WRONG_OUTPUT)
    if isinstance(outcome, TurnFailed) and outcome.reason in wrong:
        raise ValueError(outcome.detail)
    return outcome


def output_kind(config: Config, output: Any, agent: str | None) -> Any:
    """The Python type a facade decodes a typed turn's ``output`` to: ``output`` itself, or
    else the ``output`` type of profile ``agent`` (``default`` for None); None: keep the
    JSON value."""
    if output is not None:
        return output
    # The profile itself, not config.agent(): that builds (and validates) an empty default
    # profile on each call, which cost a plain turn several per cent of its CPU; an
    # unconfigured default profile has no output type.
    profile = config.agents.get(agent or DEFAULT_AGENT)
    return profile.output if profile is not None else None


def turn_timed_out(session: str, timeout: float | None) -> TimeoutError:
    """What ``run_turn`` raises when ``session``'s turn outlasts ``timeout``."""
    return TimeoutError(f"the turn of {session} did not end within {timeout} s; it goes on")
