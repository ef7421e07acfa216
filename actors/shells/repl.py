"""``loopd repl``: a Python console with a started runtime and helpers to drive it (SPEC 10).

The console is the standard library's :class:`code.InteractiveConsole`, with readline tab
completion when readline is available. Its namespace holds the :class:`Runtime` (``rt``), the
Context's ref (``ctx``), the helpers of :class:`Helpers` and the common message classes. Event
lines printed by subscribers (``turn`` while it runs, ``tail`` until turned off) come from the
event bus thread and may land in the middle of the prompt; that is expected.
"""

from __future__ import annotations

import code
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import pykka

import actors
import messages
from actors.core.config import Config, check_wait
from actors.core.dispatch import descends_from
from actors.core.text import escape_controls, redact
from actors.dispatcher.directory import CONTEXT, EVENTS, MODEL, PORT, STORE, session_address
from actors.runtime import Runtime
from actors.shells.render import EventPrinter, approvals_table, table
from actors.shells.views import SessionRow, SessionTable, SessionView, session_view
from actors.stores.base import StoreError
from actors.stores.open import open_store
from actors.tools.tool import PortTool
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ChatMessage,
    ContextStatus,
    FailReason,
    Inspect,
    SessionRecord,
    StartTurn,
    TurnCompleted,
    TurnEnded,
    TurnEvent,
    TurnFailed,
    TurnOutcome,
    check_session_id,
)

__all__ = ["AddressError", "Helpers", "resolve_address", "run_repl"]

SERVICES = frozenset({CONTEXT, STORE, MODEL, PORT, EVENTS})
"""Names that mean a runtime service, not a session of that name (use ``session:<id>`` then)."""

_LAST_EVENTS_S = 5.0
"""How long ``turn`` waits, after the outcome, for the bus to print the turn's last events."""

_MESSAGE_CLASSES: dict[str, Any] = {
    "StartTurn": StartTurn,
    "Inspect": Inspect,
    "TurnCompleted": TurnCompleted,
    "TurnFailed": TurnFailed,
    "FailReason": FailReason,
    "ContextStatus": ContextStatus,
    "SessionRecord": SessionRecord,
    "ChatMessage": ChatMessage,
}


class AddressError(LookupError):
    """Nobody stands at the address a helper was given."""


def resolve_address(target: str) -> str:
    """The directory address that ``target`` names in the REPL's ``tell`` and ``ask``.

    ``"context"`` (and the other services: ``store``, ``model``, ``port``, ``events``) name
    themselves; anything with a ``:`` is an address already (``"session:demo"``); any other
    text must be a valid session id and means that session's actor (``"demo"`` →
    ``"session:demo"``). Raises ``ValueError`` naming an invalid id.
    """
    if not isinstance(target, str):
        raise TypeError(f"an address must be a string, not {type(target).__name__}: {target!r}")
    if target in SERVICES or ":" in target:
        return target
    return session_address(check_session_id(target))


def _print(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


class _StdoutPrinter:
    """An :class:`EventPrinter` of the current ``sys.stdout`` (the console may replace it)."""

    def __init__(self) -> None:
        self._printer: EventPrinter | None = None
        self._stream: object = None

    def __call__(self, event: TurnEvent) -> None:
        if self._printer is None or self._stream is not sys.stdout:
            self._stream = sys.stdout
            self._printer = EventPrinter(sys.stdout)
        self._printer(event)


_PRINTER = _StdoutPrinter()


def _print_event(event: TurnEvent) -> None:
    _PRINTER(event)


class _SendReply:
    """The one-shot mailbox of ``send``: prints the turn's outcome when it comes, then goes."""

    def __init__(self, helpers: Helpers, address: str) -> None:
        self._helpers = helpers
        self._address = address

    def tell(self, message: Any) -> None:
        self._helpers.rt.directory.unregister(self._address, self)
        _print(escape_controls(f"send: {message!r}"))


class McpTable(dict[str, Any]):
    """``mcp()``'s answer: each MCP server's last ``McpServerUp`` / ``McpServerDown`` by name
    (a dict), printed as a table of NAME, STATE and its tools or why it is down."""

    def __repr__(self) -> str:
        rows = [
            [name, "starting", ""]
            if event is None
            else [name, "up", ", ".join(event.tools)]
            if isinstance(event, messages.McpServerUp)
            else [name, "down", event.detail]
            for name, event in sorted(self.items())
        ]
        return escape_controls(table(rows, ["NAME", "STATE", "TOOLS / WHY"]))


class Helpers:
    """The REPL's helpers over one started runtime; ``namespace()`` is what the console sees."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._untail: Callable[[], None] | None = None

    @property
    def tailing(self) -> bool:
        """True while ``tail`` prints every event."""
        return self._untail is not None

    # Looking.

    def status(self) -> ContextStatus:
        """The Context's answer to ``Inspect()``: held and live session ids."""
        # The REPL's helpers run on the console thread, outside every actor: blocking is fine.
        answer: ContextStatus = self.rt.context.ask(Inspect(), block=True, timeout=5)
        return answer

    def sessions(self) -> SessionTable:
        """Every stored session: id, slot, turns, untrusted, messages, and its state; it
        prints as a table.

        STATE is ``held`` while a turn holds the id, ``live`` while its actor runs idle, ``-``
        otherwise: only stored (a child's actor goes when its one turn ends; an idle top-level
        session's is passivated after ``sessions.idle_s``; the next turn rebuilds it).
        """
        status = self.status()
        store = open_store(self.rt.config)
        try:
            infos = store.list_sessions()
        finally:
            store.close()
        stored = {i.id for i in infos}

        def state(session: str) -> str:
            if session in status.held:
                return "held"
            return "live" if session in status.live else "-"

        rows = [
            SessionRow(i.id, i.slot, i.turns, i.untrusted, i.messages, state(i.id)) for i in infos
        ]
        # A session being opened is held before the store has it.
        for session in sorted((set(status.held) | set(status.live)) - stored):
            rows.append(SessionRow(session, None, None, None, None, state(session)))
        return SessionTable(rows)

    def held(self) -> tuple[str, ...]:
        """The ids a running turn holds now (a user's turn or a subagent's), sorted."""
        return tuple(self.status().held)

    def live(self) -> tuple[str, ...]:
        """The ids whose session actor is live now (held or idle), sorted; the others are only
        stored, and their next turn rebuilds them from the store."""
        return self.rt.live(timeout=5)

    def mcp(self) -> McpTable:
        """Each ``[mcp.NAME]`` server's state: up with its tools, down and why, or starting."""
        found = self.rt.mcp_servers()
        return McpTable({name: found.get(name) for name in self.rt.config.mcp})

    def show(self, session: str) -> SessionView:
        """The stored session ``session``: its record, children and messages. It prints like
        ``loopd sessions show``; its fields are data (``show("demo").record.turns``)."""
        check_session_id(session)
        store = open_store(self.rt.config)
        try:
            return session_view(store, session, self.rt.config)
        finally:
            store.close()

    # Turns.

    def turn(
        self,
        session: str,
        text: str,
        timeout: float = 120,
        *,
        agent: str | None = None,
        output: Any = None,
    ) -> TurnOutcome:
        """Run one turn of ``session`` and return its TurnCompleted or TurnFailed; ``agent``
        picks the profile of a new session (``ValueError`` for another one than a stored
        session's), ``output`` a typed result (a msgspec Struct or a JSON schema, as
        ``Runtime.run_turn`` takes it: ``outcome.output`` is the value).

        The turn's events, its children's included, are printed live while it runs (once
        only if ``tail`` is on). Raises ``ValueError`` for an invalid id and ``TimeoutError``
        after ``timeout`` seconds (the turn goes on). Ctrl-C cancels the turn and its children
        and returns ``TurnFailed(reason=CANCELLED)``, back at the prompt.
        """
        ended = threading.Event()

        def watch(event: TurnEvent) -> None:
            if not self.tailing:
                _print_event(event)
            if isinstance(event, TurnEnded) and event.session == session:
                ended.set()

        unsubscribe = self.rt.subscribe(watch)
        try:
            try:
                outcome = self.rt.run_turn(session, text, timeout, agent=agent, output=output)
            except KeyboardInterrupt:
                return self._interrupted(session)
            # The session emits TurnEnded before it reports the outcome, so the bus has it
            # already; wait for it to be printed. A BUSY refusal never began, so has none.
            if not (isinstance(outcome, TurnFailed) and outcome.reason == FailReason.BUSY):
                ended.wait(_LAST_EVENTS_S)
            return outcome
        finally:
            unsubscribe()

    def wait(self, session: str, timeout: float = 120) -> None:
        """Wait until ``session`` and its descendants are idle and no background report for
        them is pending (``rt.wait_family``), printing their events live (unless ``tail`` is
        on): how the REPL shows background children at work after the turn that started
        them. ``TimeoutError`` after ``timeout`` seconds."""

        def watch(event: TurnEvent) -> None:
            ours = event.session == session or descends_from(event.session, session)
            if ours and not self.tailing:
                _print_event(event)

        unsubscribe = self.rt.subscribe(watch)
        try:
            self.rt.wait_family(session, timeout)
        finally:
            unsubscribe()

    def _interrupted(self, session: str) -> TurnFailed:
        """Ctrl-C during ``turn``: cancel the turn and its children, say so in one line."""
        cancelled = self.rt.cancel(session)
        if cancelled:
            _print(f"Ctrl-C: cancelled {', '.join(cancelled)}")
        else:
            _print(f"Ctrl-C: the turn of {session} had ended already")
        return TurnFailed(session, FailReason.CANCELLED, "cancelled with Ctrl-C")

    def send(self, session: str, text: str, *, agent: str | None = None) -> None:
        """Start a turn of ``session`` (of profile ``agent``, if new) and return at once.

        Its events print if ``tail()`` is on; its outcome prints as ``send: ...`` when it
        comes. Raises ``ValueError`` for an invalid id or a child's (``sub-...``), and as
        ``run_turn`` does for bad text.
        """
        address = self.rt.directory.unique("repl-send")
        if agent is not None and agent not in self.rt.config.agent_names():
            raise ValueError(f"no agent profile is named {agent!r}")
        start = StartTurn(session, text, None, address, agent)  # checks the id, text first
        reply = _SendReply(self, address)
        self.rt.directory.register(address, reply)
        try:
            self.rt.context.tell(start)
        except BaseException:
            self.rt.directory.unregister(address, reply)
            raise

    def tail(self, on: bool = True) -> None:
        """Print every turn event as it happens (``tail()``), or stop (``tail(False)``)."""
        with self._lock:
            if on and self._untail is None:
                self._untail = self.rt.subscribe(_print_event)
            elif not on and self._untail is not None:
                self._untail()
                self._untail = None
        _print("tail on: every event prints" if on else "tail off")

    def stop_tail(self) -> None:
        """Stop tailing without a word (for the console's exit)."""
        with self._lock:
            if self._untail is not None:
                self._untail()
                self._untail = None

    # Messages.

    def _mailbox(self, target: str) -> tuple[str, Any]:
        address = resolve_address(target)
        mailbox = self.rt.directory.get(address)
        if mailbox is None:
            known = ", ".join(self.rt.directory.addresses())
            hint = ""
            if address.startswith("session:"):
                hint = " (a session's actor is there only while it is live: see sessions())"
            raise AddressError(f"no actor at address {address!r}{hint}; addresses now: {known}")
        return address, mailbox

    def tell(self, target: str, message: Any) -> None:
        """Tell ``message`` to an actor without waiting.

        ``target`` is an address (``"context"``, ``"session:demo"``) or a bare session id
        (``"demo"`` means ``"session:demo"``). Raises ``AddressError`` if nobody is there.
        """
        address, mailbox = self._mailbox(target)
        try:
            mailbox.tell(message)
        except pykka.ActorDeadError:
            raise AddressError(f"the actor at address {address!r} has stopped") from None

    def ask(self, target: str, message: Any, timeout: float = 5) -> Any:
        """Ask an actor and return its answer: ``ask("demo", Inspect())`` is the session's
        SessionRecord, ``ask("context", Inspect())`` the Context's ContextStatus.

        ``target`` as for ``tell``. Raises ``AddressError`` if no actor is there and
        ``TimeoutError`` if it has not answered after ``timeout`` seconds.
        """
        check_wait(timeout, "timeout")
        address, mailbox = self._mailbox(target)
        if not isinstance(mailbox, pykka.ActorRef):
            raise AddressError(f"{address!r} is not an actor that answers; tell it instead")
        try:
            return mailbox.ask(message, block=True, timeout=timeout)
        except pykka.ActorDeadError:
            raise AddressError(f"the actor at address {address!r} has stopped") from None
        except pykka.Timeout:
            name = type(message).__name__
            raise TimeoutError(f"{address} did not answer {name} within {timeout} s") from None

    def approvals(self) -> tuple[ApprovalRequested, ...]:
        """Print the calls waiting for a person (oldest first, untrusted ones marked) and
        return them."""
        waiting = self.rt.pending_approvals()
        _print(approvals_table(waiting))
        return waiting

    def approve(
        self, session: str, call_id: int, note: str | None = None
    ) -> ApprovalSettled | ApprovalRefused:
        """Say yes to a waiting call; it runs as any call would."""
        return self.rt.approve(session, call_id, note)

    def deny(self, session: str, call_id: int, reason: str) -> ApprovalSettled | ApprovalRefused:
        """Say no to a waiting call; the model reads ``reason``."""
        return self.rt.deny(session, call_id, reason)

    def namespace(self) -> dict[str, Any]:
        """What the console sees: rt, ctx, the helpers, ``messages`` and common messages."""
        return {
            "__name__": "__console__",
            "__doc__": None,
            "rt": self.rt,
            "ctx": self.rt.context,
            "sessions": self.sessions,
            "held": self.held,
            "live": self.live,
            "mcp": self.mcp,
            "turn": self.turn,
            "send": self.send,
            "wait": self.wait,
            "tell": self.tell,
            "ask": self.ask,
            "show": self.show,
            "tail": self.tail,
            "approvals": self.approvals,
            "approve": self.approve,
            "deny": self.deny,
            "messages": messages,
            **_MESSAGE_CLASSES,
        }


_HELP = [
    ("rt, ctx", "the Runtime and the Context's actor ref"),
    ("sessions()", "stored sessions, each held / live / - (stored only)"),
    ("held()", "the ids running turns hold"),
    ("live()", "the ids with a live actor (the rest are only stored)"),
    ("mcp()", "each MCP server: up and its tools, or down and why"),
    ("turn(session, text)", "run a turn, its events printed live"),
    ("send(session, text)", "start a turn, don't wait"),
    ("wait(session)", "until its family is idle, background children included"),
    ("tell(address, message)", 'tell an actor: "context", "demo" (= "session:demo")'),
    ("ask(address, message)", 'its answer: ask("demo", Inspect()).turns'),
    ("show(session)", "a stored transcript"),
    ("tail(on=True)", "print every event as it happens"),
    ("approvals()", "the calls waiting for a person (untrusted ones marked)"),
    ("approve(s, id) / deny(s, id, why)", "decide a waiting call"),
    ("messages", ", ".join(_MESSAGE_CLASSES) + ", ..."),
]


def banner(rt: Runtime, scripted: bool) -> str:
    """The console's banner: where it runs, the helpers in one table, how to leave."""
    from actors.shells.demo import DEMO_SESSION, DEMO_TEXT

    model = "the demo's scripted model, offline" if scripted else redact(rt.config.model.base_url)
    width = max(len(name) for name, _ in _HELP)
    lines = [
        f"loopd repl: a started runtime on {model}; home {rt.config.home_path}",
        "",
        *(f"  {name.ljust(width)}  {what}" for name, what in _HELP),
        "",
        "help(turn) and the like tell more; Ctrl-D or exit() stops the runtime and leaves.",
    ]
    if scripted:
        lines.append(f"Try: turn({DEMO_SESSION!r}, {DEMO_TEXT!r})".replace("'", '"'))
    return "\n".join(lines)


_INPUT = "<loopd>"
"""The file name of what the user types at the prompt."""

_OWN_CODE = tuple(
    os.path.dirname(os.path.abspath(module.__file__ or "")) + os.sep
    for module in (actors, messages)
)

_MISTAKES = (
    ValueError,
    TypeError,
    LookupError,
    TimeoutError,
    NameError,
    AttributeError,
    StoreError,
)
"""What a user's slip raises: a bad id, a wrong argument, a typo, no such actor or stored
session, a timeout."""


def _typed(filename: str) -> bool:
    return filename == _INPUT or filename.startswith("<ipython-input-")


def mistake_line(exc: BaseException) -> str | None:
    """One line for a user's mistake (``ValueError: invalid session id ...``), or None for
    what deserves a whole traceback (a bug, or an error in code the user brought).

    A mistake is one of :data:`_MISTAKES` raised by what was typed at the prompt, or inside
    loopd's own code that it called; loopd's frames are of no use to the user then.
    """
    if not isinstance(exc, _MISTAKES):
        return None
    frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    # Skip the console's own frames up to the first line the user typed: ``<loopd>`` in the
    # plain console, ``<ipython-input-...>`` in IPython.
    while frames and not _typed(frames[0]):
        frames.pop(0)
    if not frames or not all(_typed(f) or f.startswith(_OWN_CODE) for f in frames):
        return None
    return f"{type(exc).__name__}: {exc}"


class _Console(code.InteractiveConsole):
    """The standard console, reading from ``stdin`` instead of ``input()`` when one is given,
    and showing a user's mistake in one line (:func:`mistake_line`)."""

    def __init__(self, namespace: dict[str, Any], stdin: TextIO | None) -> None:
        super().__init__(namespace, filename=_INPUT)
        self._stdin = stdin

    def showtraceback(self) -> None:
        exc = sys.exc_info()[1]
        line = mistake_line(exc) if exc is not None else None
        if line is None:
            super().showtraceback()
        else:
            self.write(line + "\n")

    def raw_input(self, prompt: str = "") -> str:
        if self._stdin is None:
            return input(prompt)
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = self._stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")


def _enable_completion(namespace: dict[str, Any]) -> None:
    """Tab completion of the console's names, if readline is there."""
    try:
        import readline
        import rlcompleter
    except ImportError:  # readline is optional (Windows, some builds)
        return
    readline.set_completer(rlcompleter.Completer(namespace).complete)
    if "libedit" in (readline.__doc__ or ""):
        readline.parse_and_bind("bind ^I rl_complete")
    else:
        readline.parse_and_bind("tab: complete")


def ipython_available() -> bool:
    """True when IPython is installed (the REPL then uses it by default)."""
    return importlib.util.find_spec("IPython") is not None


def _run_ipython(namespace: dict[str, Any], banner_text: str) -> None:
    """The IPython shell on ``namespace``, with a user's mistake in one line."""
    from IPython.terminal.ipapp import TerminalIPythonApp
    from traitlets.config import Config as ShellConfig

    settings: Any = ShellConfig()
    settings.TerminalInteractiveShell.banner1 = banner_text + "\n"
    settings.TerminalInteractiveShell.confirm_exit = False
    settings.TerminalIPythonApp.display_banner = True
    settings.HistoryManager.hist_file = ":memory:"  # the REPL's lines are not kept on disk
    namespace = {k: v for k, v in namespace.items() if k not in ("__name__", "__doc__")}
    app: Any = TerminalIPythonApp.instance(config=settings, user_ns=namespace)
    app.initialize(argv=[])
    shell = app.shell

    def one_line(
        shell: Any, kind: type[BaseException], exc: BaseException, tb: Any, tb_offset: Any = None
    ) -> None:
        exc.__traceback__ = tb
        line = mistake_line(exc)
        if line is None:
            shell.showtraceback((kind, exc, tb), tb_offset=tb_offset)
        else:
            print(line, file=sys.stderr, flush=True)

    shell.set_custom_exc(_MISTAKES, one_line)
    app.start()
    TerminalIPythonApp.clear_instance()


def run_repl(
    config: Config,
    *,
    scripted: bool = False,
    stdin: TextIO | None = None,
    tools: Sequence[PortTool] = (),
    shell: str = "auto",
) -> int:
    """Start a runtime on ``config`` and run the console until Ctrl-D or ``exit()``.

    ``scripted`` runs the demo's scripted model instead of the HTTP client; ``stdin`` feeds
    the console from a stream instead of the terminal (for tests; no readline then). The
    runtime is stopped whatever way the console ends. Returns the exit status: 0, or the
    number given to ``exit(n)``. ``tools`` are the port's tools (``--tools``). ``shell`` is
    ``"ipython"``, ``"plain"`` (the standard console) or ``"auto"``: IPython when it is
    installed and the console reads the terminal.
    """
    use_ipython = shell == "ipython" or (shell == "auto" and stdin is None and ipython_available())
    if use_ipython and not ipython_available():
        raise ValueError("--ipython: IPython is not installed (pip install ipython)")
    model = None
    if scripted:
        from actors.shells.demo import demo_script
        from actors.testing.model import ScriptedModel

        model = ScriptedModel(demo_script)
    rt = Runtime.start(config, model=model, tools=tools)
    helpers = Helpers(rt)
    status = 0
    try:
        namespace = helpers.namespace()
        try:
            if use_ipython:
                _run_ipython(namespace, banner(rt, scripted))
            else:
                if stdin is None:
                    _enable_completion(namespace)
                console = _Console(namespace, stdin)
                console.interact(banner=banner(rt, scripted), exitmsg="")
        except SystemExit as exc:  # exit() / quit()
            if isinstance(exc.code, int):
                status = exc.code
            elif exc.code is not None:
                print(exc.code, file=sys.stderr)
                status = 1
    finally:
        helpers.stop_tail()
        rt.stop()
    _print("loopd: runtime stopped")
    return status
