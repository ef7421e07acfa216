"""The Runtime facade: what a supervisor process embeds.

The facade itself is here; what it checks before anything is sent is in ``checks``, and the
parts it is wired from (the resolved config, the tracer, a cluster engine found by entry point,
the MCP service) are picked in ``parts``. ``collector`` sets the garbage collector for a
process serving many turns at once (``loopd serve`` calls it; the facade never does).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import queue
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import msgspec
import pykka

from actors.core.agents import Agents
from actors.core.approvals import approval_policies, check_call_id, decision_text
from actors.core.config import Config, check_wait
from actors.core.dispatch import Registry
from actors.core.limits import Limits
from actors.core.mcp_config import McpServerConfig
from actors.core.mcp_tools import McpCatalog
from actors.core.output import OutputTypes, decoded, turn_output
from actors.core.text import RedactFilter, redact
from actors.dispatcher import Dispatcher
from actors.dispatcher.caller import lend_caller
from actors.dispatcher.directory import CONTEXT, EVENTS, MCP, MODEL, PORT, STORE, Directory
from actors.models.base import AsyncChatModel, ChatModel
from actors.models.endpoints import AgentEndpoints
from actors.models.http import HttpChatModel
from actors.models.offline import check_real_model
from actors.runtime.checks import (
    _utc_now,
    check_outcome,
    check_turn,
    output_kind,
    turn_timed_out,
)
from actors.runtime.interrupted import end_interrupted, tell_start_subscribers
from actors.runtime.parts import (
    ENGINES,
    LIBRARY_LOGGERS,
    RemoteAgents,
    _context_tokens,
    _engine,
    _mcp_service,
    default_tracer,
    resolve_config,
)
from actors.runtime.stopping import await_stops, in_start_order
from actors.services.events import EventBus, EventSink, Subscribers
from actors.services.model_service import ModelService
from actors.services.pool import PortRouter
from actors.services.scheduler import SCHEDULER, STATE_NAME, SchedulerActor
from actors.services.store import StoreActor
from actors.services.tool_loop import app_loop
from actors.sessions.context import ContextActor
from actors.sessions.session import SessionEnv
from actors.stores.lock import HomeLock
from actors.stores.memory import MemorySource, default_memory
from actors.stores.open import open_store, shared_memory, shared_schedule
from actors.tools.tool import (
    PortTool,
    port_async_job,
    port_error,
    port_handler,
    port_lost,
    port_timeout,
)
from actors.tracing.base import NoTracer, Tracer, guarded
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ApproveCall,
    CancelTurn,
    ContextStatus,
    DenyCall,
    Inspect,
    ListApprovals,
    McpServerDown,
    McpServerUp,
    TurnEvent,
    TurnOutcome,
    WaitFamily,
    check_session_id,
)

if TYPE_CHECKING:
    from actors.services.mcp import McpService
    from actors.stores.postgres import PgMemory

__all__ = [
    "ENGINES",
    "Runtime",
    "check_outcome",
    "check_turn",
    "default_tracer",
    "output_kind",
    "resolve_config",
    "turn_timed_out",
]

log = logging.getLogger(__name__)

"""Loggers of the libraries loopd drives whose texts may carry a credential (a URL's)."""


class _Waiter:
    """A one-shot mailbox for a caller outside the actors (``run_turn``): the first message
    told is the answer.

    On a C ``SimpleQueue``: a ``threading.Event`` is a ``Condition`` in Python, whose set and
    wait cost a turn several per cent of its CPU (its lock, its list of waiters, a new lock
    per wait); a later message only stays behind the first, unread."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def tell(self, message: Any) -> None:
        self._queue.put(message)

    def wait(self, timeout: float | None) -> Any:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None


class Runtime:
    """A started loopd: the Context, the store, the model service, the port and the event bus.

    Start it with :meth:`start` (or as a context manager), drive it with :meth:`run_turn` or by
    telling messages to :attr:`context`, watch it with :meth:`subscribe`, end it with
    :meth:`stop`. Methods of the facade may block; they are for callers outside the actors.
    """

    def __init__(
        self,
        config: Config,
        directory: Directory,
        subscribers: Subscribers,
        refs: dict[str, pykka.ActorRef[Any]],
        model: ChatModel | AsyncChatModel,
        registry: Registry,
        model_service: ModelService,
        dispatcher: Dispatcher,
    ) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.directory = directory
        self.registry = registry
        self.model = model
        self.model_service = model_service
        self._subscribers = subscribers
        self._refs = refs
        self._stopped = False
        self._owns_model = True
        self._home_lock: HomeLock | None = None
        self._log_filter: RedactFilter | None = None
        self._shared_memory: PgMemory | None = None
        self._mcp: McpService | None = None
        self._a2a = RemoteAgents()  # the A2A service of remote agents: none
        self.tracer: Tracer = NoTracer()
        self.output_types = OutputTypes()
        """The Python types of output schemas, shared with the sessions (msgspec validates
        a session whose schema has one)."""

    @classmethod
    def start(
        cls,
        config: Config,
        *,
        model: ChatModel | AsyncChatModel | None = None,
        tools: Iterable[PortTool] | None = None,
        memory: MemorySource | None = None,
        clock: Callable[[], datetime] = _utc_now,
        tracer: Tracer | None = None,
        mcp: Mapping[str, McpServerConfig] | None = None,
        subscribe: Iterable[Callable[[TurnEvent], Any]] = (),
    ) -> Runtime:
        """Start every actor of a runtime on ``config``.

        ``model`` replaces the HTTP client (for example with the test kit's ``ScriptedModel``),
        ``tools`` are the port's tools, ``memory`` replaces the ``home/MEMORY.md`` source, and
        ``clock`` the wall clock (for tests that pin the time). ``slots.total = "auto"`` reads
        the server's slot count here (see :func:`resolve_config`); ``rt.config`` has the result.
        ``tracer`` gets every turn event for tracing; by default OpenTelemetry's when it is
        installed (``loopd[otel]``), else none (:class:`actors.tracing.base.NoTracer`).
        ``mcp`` adds MCP servers by name to the config's ``[mcp.NAME]`` (``loopd[mcp]``); the
        start waits for their tool lists at most their ``timeout_s``, all at once.
        ``subscribe`` functions get every event from the start on, first the
        ``TurnEnded(reason=CRASHED)`` of each turn a crash cut off (ended here, before this
        returns; ``actors.runtime.interrupted``).

        Raises :class:`~actors.stores.lock.HomeInUse` if another runtime holds ``config.home``.

        With ``[cluster] engine = "ray"`` the sessions run on Ray shard actors and the facade
        returned is a :class:`~actors.cluster.ClusterRuntime` (``tools`` go to every shard;
        ``model``, ``memory`` and ``clock`` cannot cross to other processes).
        """
        # The test kit's switch (off by default): the HTTP client talks to every profile's
        # endpoint, and slots.total = "auto" asks the main one for its slots.
        if model is None:
            for name in config.agent_names():
                check_real_model(config.endpoint(name).base_url)
        elif config.slots.total == "auto":
            check_real_model(config.model.base_url)
        if config.cluster.engine == "ray":
            if mcp or config.mcp:
                raise ValueError("[mcp] servers run in one process: a cluster runtime has none")
            if model is not None or memory is not None or clock is not _utc_now:
                raise ValueError(
                    "a cluster runtime's shards use [model], the shared store's memory and the "
                    "wall clock: model=, memory= and clock= are for one process only"
                )
            engine: Any = _engine(config.cluster.engine)
            launched: Runtime = engine.launch(config, tools=tools or (), subscribe=subscribe)
            return launched
        if mcp:
            config = config.replace(mcp={**config.mcp, **mcp})
        config = resolve_config(config)
        tools = list(tools or ())
        registry = Registry((tool.spec for tool in tools), mcp=McpCatalog(config.mcp))
        agents = Agents(config, registry)  # a profile naming no such tool fails here
        config.home_path.mkdir(parents=True, exist_ok=True)
        # One runtime per home: two would reuse call ids and miscount turns (issue 8).
        home_lock = HomeLock.acquire(config.home_path)
        try:
            runtime = cls._start(
                config, registry, agents, model, tools, memory, clock, tracer, tuple(subscribe)
            )
        except BaseException:
            home_lock.release()
            raise
        runtime._home_lock = home_lock
        return runtime

    @classmethod
    def _start(
        cls,
        config: Config,
        registry: Registry,
        agents: Agents,
        model: ChatModel | AsyncChatModel | None,
        tools: list[PortTool],
        memory: MemorySource | None,
        clock: Callable[[], datetime],
        tracer: Tracer | None,
        subscribe: tuple[Callable[[TurnEvent], Any], ...] = (),
    ) -> Runtime:
        # Open the store once here so a bad file fails the start, not every later turn; end
        # the turns a crash cut off before anything else runs.
        with contextlib.closing(open_store(config)) as store:
            crashed = end_interrupted(store, agents, clock)
        tell_start_subscribers(subscribe, crashed)
        # Every child of one answer must be able to wait for the model at once.
        concurrency = max(config.model.concurrency, config.loop.max_children)
        model_config = msgspec.structs.replace(config.model, concurrency=concurrency)
        chat_model: ChatModel | AsyncChatModel
        if model is not None:
            chat_model = model
        elif any(config.endpoint(name) is not config.model for name in config.agents):
            chat_model = AgentEndpoints(config, model_config)  # profiles on other servers
        else:
            chat_model = HttpChatModel(model_config)
        shared = shared_memory(config) if memory is None else None
        if memory is None:
            memory = shared or default_memory(
                config.home,
                config.memory.file,
                max_chars=config.memory.max_chars,
                max_entry_chars=config.memory.max_entry_chars,
            )
        directory = Directory()
        subscribers = Subscribers()
        for fn in subscribe:
            subscribers.add(fn, False)
        limits = Limits(
            max_steps=config.loop.max_steps,
            tool_result_cap=config.loop.tool_result_cap,
            summary_chars=config.compact.summary_chars,
            threshold_chars=config.compact.threshold_chars,
            max_depth=config.loop.max_depth,
            max_children=config.loop.max_children,
            untrusted_may_remember=config.memory.allow_untrusted_writes,
            context_tokens=_context_tokens(config, own_model=model is None),
            threshold_ratio=config.compact.threshold_ratio,
            max_tokens=config.model.max_tokens,
            keep_truncated=config.model.on_length == "keep",
            output_retries=config.loop.output_retries,
        )
        dispatcher = Dispatcher(config.runtime.threads, name="loopd")
        # Guarded: a tracer that raises (a failing span processor) never changes an outcome.
        tracer = guarded(tracer if tracer is not None else default_tracer())
        tracer.configure(config)
        env = SessionEnv(
            directory,
            registry,
            limits,
            clock,
            itertools.count(1),
            dispatcher,
            agents=agents,
            budgeted=config.loop.token_budget is not None,
            tracer=tracer,
            approvals=approval_policies(
                config,
                (t.name for t in tools if t.approval),
                {t.name: t.check_arguments for t in tools},
            ),
        )
        refs: dict[str, pykka.ActorRef[Any]] = {}
        secrets = config.secrets()
        mcp = _mcp_service(config, registry, directory)
        a2a = RemoteAgents(config, directory)
        service = ModelService(
            chat_model,
            directory,
            concurrency=concurrency,
            pools={name: config.slots.pool(name) for name in ("main", "background")},
            grace_s=config.model.disconnect_grace_s,
            scrub=functools.partial(redact, secrets=secrets),
            lend_thread=dispatcher.lend,
        )
        try:
            if mcp is not None:  # first: its servers start while the rest does
                mcp.start()
                directory.register(MCP, mcp)
            refs[EVENTS] = EventBus.start(subscribers)
            refs[STORE] = StoreActor.start(
                lambda: open_store(config), directory, dispatcher.lend, dispatcher.lent_here
            )
            service.start()
            directory.register(MODEL, service)
            refs[PORT] = PortRouter.start(
                config.port.concurrency,
                port_handler(tools),
                port_error,
                directory,
                timeout_s=config.port.timeout_s,
                on_timeout=port_timeout,
                async_job=port_async_job(tools),
                on_lost=port_lost,
                app_loop=app_loop(),  # AsyncRuntime's loop, or None: the port's own
            )
            directory.register(EVENTS, EventSink(refs[EVENTS], subscribers))
            for address in (STORE, PORT):
                directory.register(address, refs[address])
            a2a.start(refs[STORE])  # and the remote tasks a crash left are cancelled
            if mcp is not None:  # before the Context, which resumes turns that may call them
                late = mcp.wait_ready(max(s.timeout_s for s in config.mcp.values()))
                if late:
                    log.warning(
                        "loopd: MCP servers still starting (they join later): %s", ", ".join(late)
                    )
            # The calls that waited for a person when the last runtime stopped: the Context
            # holds their sessions from its first message on (SPEC 11).
            waiting = refs[STORE].ask(ListApprovals(), timeout=30)
            refs[CONTEXT] = ContextActor.start(
                config, directory, registry, memory, env, clock, waiting
            )
            # At its address now, not only once its on_start has run on a dispatcher thread:
            # what is told meanwhile (a cron job due at start) waits in its mailbox behind
            # on_start instead of being a dead letter.
            directory.register(CONTEXT, refs[CONTEXT])
            if config.cron or config.heartbeat:
                refs[SCHEDULER] = SchedulerActor.start(
                    config,
                    directory,
                    clock,
                    state_path=config.home_path / STATE_NAME,
                    state_store=shared_schedule(config),
                )
        except BaseException:
            a2a.stop()
            if mcp is not None:
                mcp.stop()
            service.stop()
            for ref in reversed(refs.values()):
                ref.stop()
            dispatcher.shutdown()
            if model is None:
                chat_model.close()
            raise
        runtime = cls(
            config, directory, subscribers, refs, chat_model, registry, service, dispatcher
        )
        runtime.tracer = tracer
        runtime.output_types = agents.output_types
        runtime._mcp = mcp
        runtime._a2a = a2a
        runtime._owns_model = model is None  # a model passed in is the caller's to close
        runtime._log_filter = RedactFilter(secrets)
        for name in LIBRARY_LOGGERS:
            logging.getLogger(name).addFilter(runtime._log_filter)
        runtime._shared_memory = shared
        return runtime

    @property
    def context(self) -> pykka.ActorRef[Any]:
        """The Context actor's ref, for ``tell`` and ``ask`` from outside the actors."""
        return self._refs[CONTEXT]

    def subscribe(
        self, fn: Callable[[TurnEvent], Any], *, inline: bool = False
    ) -> Callable[[], None]:
        """Call ``fn(event)`` for every turn event, children's included, from the bus thread.

        With ``inline``, ``fn`` is called at once on the thread that emits the event (an
        actor's), with no hop to the bus: it must only hand the event on, never block.
        Returns a function that unsubscribes ``fn``.
        """
        return self._subscribers.add(fn, inline)

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
        """Start a turn without waiting; its outcome goes to the ``reply_to`` address, if any.

        Raises as :meth:`run_turn` does for a bad session id, text, speaker, agent name or
        output schema; a stored session of another agent is answered
        ``TurnFailed(reason=WRONG_AGENT)``, of another output schema ``WRONG_OUTPUT``. The
        outcome's ``output`` is the JSON value (no Python type is decoded on this path).
        """
        trace = self.tracer.caller_trace()
        start = check_turn(
            self.config,
            session,
            text,
            speaker=speaker,
            reply_to=reply_to,
            agent=agent,
            trace=trace,
            output=turn_output(self.output_types, output),
        )
        self._tell_context(start)

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
        """Run one turn of ``session`` and return how it ended.

        ``agent`` picks the profile (``[agents.NAME]``) of a new session; a stored session
        keeps its own, and None means just that (``default`` for a new one).

        ``output`` (a msgspec Struct or another type msgspec has a schema for, or a JSON
        schema as a dict) makes the turn typed: the model ends it by calling
        ``final_answer``, and ``TurnCompleted.output`` is the validated value, decoded to that
        type (a dict schema: the JSON value). A new session is created with that schema; a
        stored one must have been (else ``ValueError``); None keeps the session's, and a
        profile's ``output`` type decodes it.

        Raises, before anything is stored: ``ValueError`` for an invalid session id, a child's
        id (``sub-...``), text or a speaker that is not valid Unicode, a ``timeout`` that is
        not a finite number of seconds above 0, an ``agent`` the config has no profile of, or
        one that is not the stored session's; ``TypeError`` for text that is not a ``str``
        or a speaker that is neither ``str`` nor None. Raises ``TimeoutError`` if the turn has
        not ended after ``timeout`` seconds (it goes on).
        """
        address = self.directory.unique("waiter")
        trace = self.tracer.caller_trace()
        start = check_turn(
            self.config,
            session,
            text,
            timeout=timeout,
            speaker=speaker,
            reply_to=address,
            agent=agent,
            trace=trace,
            output=turn_output(self.output_types, output),
        )
        waiter = _Waiter()
        self.directory.register(address, waiter)
        try:
            # This thread waits anyway: it runs the Context's StartTurn itself, and no
            # dispatcher thread is woken for it.
            with lend_caller(self.dispatcher):
                self._tell_context(start)
            try:
                outcome: TurnOutcome = waiter.wait(timeout)
            except TimeoutError:
                raise turn_timed_out(session, timeout) from None
            return decoded(check_outcome(outcome), output_kind(self.config, output, agent))
        finally:
            self.directory.unregister(address, waiter)

    def cancel(self, session: str, timeout: float = 10.0) -> tuple[str, ...]:
        """Cancel ``session``'s running turn and every child below it.

        Each cancelled turn answers ``TurnFailed(reason=CANCELLED)`` to whoever waits on it (a
        child's parent sees ``<child> failed``). Returns the ids that were cancelled; an empty
        tuple if ``session`` had no turn running (a turn cancelled before and still winding
        down is not cancelled again). A model answer that arrives later is dropped.
        """
        self._check_cancel(session, timeout)
        cancelled = self.context.ask(CancelTurn(session), timeout=timeout)
        return tuple(cancelled)

    def wait_family(self, session: str, timeout: float | None = None) -> None:
        """Wait until ``session`` and every descendant are idle and no background report for
        any of them is pending (``[subagents] background``: a report becomes a turn of its
        parent, which this also waits for). ``TimeoutError`` after ``timeout`` seconds."""
        check_session_id(session)
        check_wait(timeout, "timeout")
        address = self.directory.unique("waiter")
        waiter = _Waiter()
        self.directory.register(address, waiter)
        try:
            self._tell_context(WaitFamily(session, address))
            try:
                waiter.wait(timeout)
            except TimeoutError:
                detail = f"the family of {session} was not idle within {timeout} s"
                raise TimeoutError(detail) from None
        finally:
            self.directory.unregister(address, waiter)

    def mcp_servers(self) -> dict[str, McpServerUp | McpServerDown]:
        """Each ``[mcp.NAME]`` server's last ``McpServerUp`` or ``McpServerDown`` event, by
        name, those of the start included (a server still starting has none yet)."""
        return {} if self._mcp is None else self._mcp.servers()

    def live(self, timeout: float = 10.0) -> tuple[str, ...]:
        """The ids of the sessions whose actor is live now, sorted.

        A top-level session stays live after its turn until it is passivated (see
        ``[sessions]`` in docs/configuration.md); a child's actor goes when its turn ends. A
        session that is not live is rebuilt from the store by its next turn.
        """
        self._check_open()
        status: ContextStatus = self.context.ask(Inspect(), block=True, timeout=timeout)
        return tuple(status.live)

    def pending_approvals(self, timeout: float = 10.0) -> tuple[ApprovalRequested, ...]:
        """The calls waiting for a person's decision, oldest ``at`` first."""
        self._check_open()
        check_wait(timeout, "timeout")
        return tuple(self.context.ask(ListApprovals(), timeout=timeout))

    def approve(
        self, session: str, call_id: int, note: str | None = None, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say yes to ``session``'s waiting call ``call_id``: it runs as any call would.
        ``ApprovalRefused`` if it is not waiting (never was, or was settled already).

        Checked before anything is told: ``call_id`` an ``int`` from 1 (``TypeError`` naming
        it for ``"1"``, ``1.0`` or a bool), ``note`` None or valid Unicode text of at most
        ``MAX_DECISION_CHARS`` (2,000) characters (``ValueError`` naming it)."""
        check_session_id(session)
        check_call_id(call_id)
        clean = None if note is None else decision_text(note, "the note")
        return self._decide(ApproveCall(session, call_id, clean), timeout)

    def deny(
        self, session: str, call_id: int, reason: str, timeout: float = 10.0
    ) -> ApprovalSettled | ApprovalRefused:
        """Say no to ``session``'s waiting call ``call_id``: the model reads
        ``Denied: a person declined this call: <reason>.``

        Checked as :meth:`approve` checks: ``reason`` must be valid Unicode text of at most
        ``MAX_DECISION_CHARS`` (2,000) characters (``ValueError`` naming it, nothing settled);
        it is neutralised (chat-template tokens, terminal escapes and control characters but
        newline and tab removed) as any text that goes to the model."""
        check_session_id(session)
        check_call_id(call_id)
        clean = decision_text(reason, "the reason")
        return self._decide(DenyCall(session, call_id, clean), timeout)

    def _decide(
        self, decision: ApproveCall | DenyCall, timeout: float
    ) -> ApprovalSettled | ApprovalRefused:
        check_session_id(decision.session)  # before anything is told: a clear ValueError
        check_wait(timeout, "timeout")
        address = self.directory.unique("waiter")
        waiter = _Waiter()
        self.directory.register(address, waiter)
        try:
            self._tell_context(msgspec.structs.replace(decision, reply_to=address))
            answer: ApprovalSettled | ApprovalRefused = waiter.wait(timeout)
            return answer
        finally:
            self.directory.unregister(address, waiter)

    def _check_open(self) -> None:
        """``RuntimeError`` once this runtime is stopped."""
        if self._stopped:
            raise RuntimeError("this runtime is stopped")

    def _check_cancel(self, session: str, timeout: float) -> None:
        """What :meth:`cancel` refuses, before it asks anything: an invalid session id or
        ``timeout`` (``ValueError``), a stopped runtime (``RuntimeError``)."""
        check_session_id(session)
        check_wait(timeout, "timeout")
        self._check_open()

    def _tell_context(self, message: Any) -> None:
        self._check_open()
        self.context.tell(message)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every actor within ``timeout`` seconds; every waiting caller is answered, the
        store is left consistent, and no thread or pykka registry entry of this runtime stays.

        Order matters: the scheduler first (no new turns), the Context next (it answers every
        held turn ``CANCELLED``), then every session at once, then the model service (every
        request in flight is cancelled and its connection closed), then the port, the store
        (after it has written what it was sent) and the event bus at once, and last the
        dispatcher's threads. A stage that overruns the deadline is logged, and the rest still
        stops.
        """
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        if SCHEDULER in self._refs:  # no new scheduled turn while the rest stops
            await_stops("the scheduler", [self._refs[SCHEDULER].stop(block=False)], left())
        await_stops("the Context", [self._refs[CONTEXT].stop(block=False)], left())
        sessions = in_start_order(
            ref
            for address in self.directory.addresses()
            if address.startswith("session:")
            and isinstance(ref := self.directory.get(address), pykka.ActorRef)
        )
        if not self.dispatcher.stop_actors(sessions, left()):
            log.warning("loopd: sessions did not stop within the stop's deadline")
        self.directory.unregister(MODEL, self.model_service)
        self.model_service.stop(timeout=left())
        if self._mcp is not None:  # every server's process ends here
            self.directory.unregister(MCP, self._mcp)
            self._mcp.stop(timeout=left())
        self._a2a.stop(left())  # every remote task still followed is cancelled
        if self._owns_model:
            self.model.close()
        rest = [self._refs[address].stop(block=False) for address in (PORT, STORE, EVENTS)]
        stored = await_stops("the port, the store and the event bus", rest, left())
        if not self.dispatcher.shutdown(left()):
            log.warning("loopd: the dispatcher's threads did not end within %s s", timeout)
        if self._log_filter is not None:
            for name in LIBRARY_LOGGERS:
                logging.getLogger(name).removeFilter(self._log_filter)
        if self._shared_memory is not None:
            self._shared_memory.close()
        if self._home_lock is not None:
            if stored or not self._refs[STORE].is_alive():
                self._home_lock.release()  # last: the store has written what it was sent
            else:  # still writing: the lock stays until the process ends (the OS frees it)
                log.warning("loopd: the store did not stop in time; its home stays locked")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
