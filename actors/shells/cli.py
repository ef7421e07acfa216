"""The ``loopd`` command line: demo, run, repl, serve, sessions, approvals, approve, deny, mcp.

Exit codes: 0 done; 1 the turn failed (or a decision was refused, or ``loopd mcp`` found a
server down); 2 bad input (flags, config, ids, files, a home a runtime holds); 124 ``run
--timeout`` ran out (the turn was cancelled); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.core.config import Config
    from actors.runtime import Runtime
    from actors.shells.client import ServiceClient
    from actors.stores.base import StoreBackend

# Every other import is made where it is used: ``loopd --version`` and ``--help`` import none
# of the runtime, and ``loopd sessions`` / ``approvals`` only the config, the store and the
# views (bench/bench_cli.py measures it; tests/shells/test_cli_startup.py keeps it so).

from actors.shells.flags import EXIT_TIMEOUT, read_output_schema

__all__ = ["EXIT_TIMEOUT", "TOOLS_HINT", "build_parser", "main"]

TOOLS_HINT = (
    "port tools are loaded with --tools MODULE:NAME (a PortTool or a list of them; see "
    "docs/guide.md#tools-on-the-command-line)"
)
"""Added to a config error naming a tool no one registered, on a command that takes --tools."""


def _config(args: argparse.Namespace) -> Config:
    import msgspec

    from actors.core.config import Config

    config = Config.load(args.config) if args.config is not None else Config()
    # ``is not None``: an empty --home or --base-url is refused by Config, not ignored.
    if args.home is not None:
        config = config.replace(home=args.home)
    model_changes: dict[str, Any] = {}
    if getattr(args, "base_url", None) is not None:
        model_changes["base_url"] = args.base_url
    if getattr(args, "model", None) is not None:
        model_changes["name"] = args.model
    if model_changes:
        config = config.replace(model=msgspec.structs.replace(config.model, **model_changes))
    return config


def _one_shot(config: Config) -> Config:
    """``config`` without its scheduled jobs: a one-shot command must not use up a due job
    that the long-lived process on the same home should run."""
    return config.replace(cron=(), heartbeat=None)


def _seconds(text: str) -> float:
    """``--timeout``: a finite number of seconds above 0 (argparse names the flag)."""
    from actors.core.config_base import check_wait

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        seconds = check_wait(value, "the timeout")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert seconds is not None
    return seconds


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the scripted three-level demo with the live event tree on stdout."""
    import tempfile

    import msgspec

    from actors.core.config import Config
    from actors.runtime import Runtime
    from actors.shells.demo import DEMO_SESSION, DEMO_TEXT, demo_script
    from actors.shells.render import EventPrinter
    from actors.testing.model import ScriptedModel
    from messages import TurnCompleted

    with tempfile.TemporaryDirectory(prefix="loopd-demo-") as scratch:
        config = Config(home=args.home if args.home is not None else scratch)
        # Streamed, so the answers show as they are written.
        config = config.replace(model=msgspec.structs.replace(config.model, stream=True))
        print(f"loopd demo: a scripted model, offline; home {config.home}\n")
        print(f"you → {DEMO_SESSION}: {DEMO_TEXT}\n")
        with Runtime.start(config, model=ScriptedModel(demo_script)) as rt:
            rt.subscribe(EventPrinter(sys.stdout))
            outcome = rt.run_turn(DEMO_SESSION, DEMO_TEXT, timeout=60)
        print()
        if isinstance(outcome, TurnCompleted):
            print(f"{DEMO_SESSION} → you: {outcome.content}")
            return 0
        print(f"the demo turn failed: {outcome.reason}: {outcome.detail}", file=sys.stderr)
        return 1


def _exit_on_sigterm() -> None:
    """Make SIGTERM leave like Ctrl-C does: through ``with Runtime``, so the runtime stops
    cleanly (turns answered CANCELLED, the store written out) before the process exits."""
    import signal

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def cmd_run(args: argparse.Namespace) -> int:
    """One turn against a real endpoint: the answer on stdout, events on stderr. With
    ``[subagents] background`` it also waits (within ``--timeout``) for the session's family:
    its background children and the turns their reports run.

    The answer and the events are shown with control characters escaped (a model cannot drive
    the terminal); the store keeps them as they were. Scheduled jobs never run here.
    """
    import msgspec

    from actors.core.text import escape_controls, redact
    from actors.runtime import Runtime
    from actors.shells import client
    from actors.shells.render import EventPrinter
    from actors.shells.serve import event_line
    from actors.tools.loader import load_tools
    from messages import TurnCompleted, check_text, check_top_level_session

    config = _one_shot(_config(args))
    remote = client.client_for(args, config)
    if remote is not None:  # a served home, or --connect: through the service
        try:
            return client.remote_run(remote, args, config)
        except TimeoutError:
            return _timed_out(remote, args)
        finally:
            remote.close()
    # Before Runtime.start creates anything under home.
    check_top_level_session(args.session)
    check_text(args.text, "the turn text")
    schema = read_output_schema(args.output_schema)
    tools = load_tools(args.tools)
    _exit_on_sigterm()
    with Runtime.start(config, tools=tools) as rt:
        if not args.quiet:
            if args.json:
                rt.subscribe(lambda event: print(event_line(event, True), file=sys.stderr))
            else:
                rt.subscribe(EventPrinter(sys.stderr))
        try:
            outcome = rt.run_turn(
                args.session, args.text, timeout=args.timeout, agent=args.agent, output=schema
            )
            if config.subagents.background:  # its background children report before the exit
                rt.wait_family(args.session, timeout=args.timeout)
        except TimeoutError:
            return _timed_out(rt, args)
    if args.json:
        print(msgspec.json.encode(outcome).decode())
        return 0 if isinstance(outcome, TurnCompleted) else 1
    if isinstance(outcome, TurnCompleted):
        print(escape_controls(outcome.content))
        return 0
    detail = escape_controls(redact(outcome.detail, config.model.secrets()))
    print(f"loopd: the turn failed: {outcome.reason}: {detail}", file=sys.stderr)
    return 1


def _timed_out(rt: Runtime | ServiceClient, args: argparse.Namespace) -> int:
    """``run --timeout`` ran out: cancel the turn (in ``rt``, or through the service) and say
    exactly what became of it."""
    import msgspec

    from messages import FailReason, TurnFailed

    cancelled = rt.cancel(args.session)
    if cancelled:
        children = len(cancelled) - 1
        below = f" and {children} child session(s) below it" if children else ""
        what = (
            f"no answer within {args.timeout:g} s (--timeout): the turn of {args.session}"
            f"{below} was cancelled; what it stored so far stays stored"
        )
    else:  # it ended in the instant between the wait running out and the cancel
        what = (
            f"no answer within {args.timeout:g} s (--timeout): the turn of {args.session} "
            "ended just then, unread; see loopd sessions show"
        )
    if args.json:
        print(msgspec.json.encode(TurnFailed(args.session, FailReason.TIMEOUT, what)).decode())
    print(f"loopd: {what}", file=sys.stderr)
    return EXIT_TIMEOUT


def cmd_repl(args: argparse.Namespace) -> int:
    """An interactive Python console with a started runtime (see actors.shells.repl)."""
    from actors.shells import client
    from actors.shells.repl import run_repl
    from actors.tools.loader import load_tools

    config = _config(args)
    if args.connect is not None:  # a thin console over a service: no runtime here
        from actors.shells.repl_client import run_remote_repl

        remote = client.client_for(args, config)
        assert remote is not None
        try:
            return run_remote_repl(remote)
        finally:
            remote.close()
    tools = load_tools(args.tools)
    return run_repl(config, scripted=args.scripted, tools=tools, shell=args.shell)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the runtime and its scheduler until SIGTERM, SIGINT or SIGHUP (see
    actors.shells.serve); a stop signal repeated while the process exits is ignored."""
    from actors.shells.serve import serve
    from actors.tools.loader import load_tools

    config = _config(args)
    tools = load_tools(args.tools)
    return serve(
        config,
        json_lines=args.json,
        tools=tools,
        restore_signals=False,
        listen=args.listen,
        tune_gc=True,
    )


def cmd_sessions(args: argparse.Namespace) -> int:
    """List stored sessions, or show one: through the service on a served home (or the one
    ``--connect`` names), else from the store, read-only."""
    from actors.shells import client
    from actors.stores.base import StoreError
    from actors.stores.open import open_store
    from actors.stores.reader import StoreReader
    from actors.stores.sqlite import DB_NAME

    config = _config(args)
    remote = client.client_for(args, config)
    if remote is not None:
        try:
            return client.remote_sessions(remote, args)
        finally:
            remote.close()
    if config.store.url is not None:  # a PostgreSQL store: read it there
        shared = open_store(config)
        try:
            return print_sessions(shared, args, config)
        finally:
            shared.close()
    home = config.home_path
    if home.exists() and not home.is_dir():
        raise StoreError(None, f"the home {home} is not a folder")
    path = home / DB_NAME
    if not path.exists():
        if args.action == "show":
            raise StoreError(args.id, f"is not stored: {path} does not exist")
        print(f"no sessions: {path} does not exist")
        return 0
    # Read-only: listing works on a home this user may not write to, and changes nothing.
    with StoreReader(path) as store:
        return print_sessions(store, args, config)


def print_sessions(
    store: StoreBackend, args: argparse.Namespace, config: Config | None = None
) -> int:
    """``loopd sessions`` (a table of every session, or one JSON line each with ``--json``) or
    ``loopd sessions show ID``."""
    from actors.shells.views import show_session, show_session_json

    if args.action == "show":
        if args.json:
            return show_session_json(store, args.id)
        return show_session(store, args.id, config)
    from actors.shells.views import session_listing, sessions_table

    rows = session_listing(store, config)
    if args.json:
        import msgspec

        for row in rows:
            print(msgspec.json.encode(session_row(row)).decode())
        return 0
    print(sessions_table(rows))
    return 0


def session_row(row: dict[str, Any]) -> dict[str, Any]:
    """One line of ``loopd sessions --json``: a ``GET /v1/sessions`` row (``session``,
    ``agent``, ``parent``, ``state``, ``background``, ``slot``, ``turns``, ``untrusted``,
    ``messages``, ``created_at``, ``updated_at``), and ``id`` (the same as ``session``, as
    before)."""
    return {"id": row["session"], **row}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``loopd``; it imports nothing of the runtime."""
    from actors.shells import approvals_cli, flags, mcp_cli

    parser = argparse.ArgumentParser(
        prog="loopd",
        description="An actor runtime for LLM agent sessions, with subagents.",
        epilog="exit codes: 0 done, 1 the turn failed, a decision was refused or an MCP server "
        "is down, 2 bad input, "
        f"{EXIT_TIMEOUT} run --timeout (or approvals --wait --timeout) ran out, 130 interrupted",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser, *, endpoint: bool = False) -> None:
        p.add_argument("--config", type=Path, help="a TOML config file")
        p.add_argument("--home", help="the folder of the session store (overrides config)")
        if endpoint:
            p.add_argument("--base-url", help="the endpoint, up to /chat/completions")
            p.add_argument("--model", help="the model name sent with each request")

    demo = sub.add_parser("demo", help="a scripted parent, child and grandchild, offline")
    demo.add_argument("--home", help="keep the demo's store here (default: a temporary folder)")
    demo.set_defaults(fn=cmd_demo)

    run = sub.add_parser("run", help="one turn against an OpenAI-compatible endpoint")
    common(run, endpoint=True)
    run.add_argument("--session", default="main", help="the session id (default: main)")
    run.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        help=f"seconds to wait (> 0); then the turn is cancelled and loopd exits {EXIT_TIMEOUT}",
    )
    run.add_argument(
        "--agent",
        help="the agent profile ([agents.NAME]) of a new session; a stored one keeps its own",
    )
    run.add_argument(
        "--output-schema",
        type=Path,
        metavar="FILE",
        help="a JSON schema file: the answer is a JSON value it validates, printed as JSON",
    )
    run.add_argument("--json", action="store_true", help="the outcome and events as JSON lines")
    _tools_flag(run)
    run.add_argument("-q", "--quiet", action="store_true", help="no events on stderr")
    flags.add_client_flags(run)
    run.add_argument("text", help="what to say")
    run.set_defaults(fn=cmd_run)

    repl = sub.add_parser("repl", help="a Python console with a started runtime")
    common(repl, endpoint=True)
    repl.add_argument("--scripted", action="store_true", help="offline, on the demo's model")
    shells = repl.add_mutually_exclusive_group()
    shells.add_argument(
        "--ipython",
        dest="shell",
        action="store_const",
        const="ipython",
        default="auto",
        help="use IPython (the default when it is installed)",
    )
    shells.add_argument(
        "--plain", dest="shell", action="store_const", const="plain", help="the plain console"
    )
    _tools_flag(repl)
    flags.add_client_flags(repl)
    repl.set_defaults(fn=cmd_repl)

    serve = sub.add_parser("serve", help="run the runtime and its schedule until SIGTERM")
    common(serve, endpoint=True)
    serve.add_argument("--json", action="store_true", help="each event as one JSON line")
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="also serve the runtime over HTTP (see [serve])"
    )
    _tools_flag(serve)
    serve.set_defaults(fn=cmd_serve)

    sessions = sub.add_parser("sessions", help="list stored sessions, or show one")
    common(sessions)
    sessions.add_argument("action", nargs="?", choices=["show"], help="show one session")
    sessions.add_argument("id", nargs="?", help="the session id to show")
    sessions.add_argument("--json", action="store_true", help="one JSON object per line")
    flags.add_client_flags(sessions)
    sessions.set_defaults(fn=cmd_sessions)
    approvals_cli.add_commands(sub, common, _config, _seconds)
    for name, remote in (
        ("approvals", _remote("remote_approvals")),
        ("approve", _remote("remote_decide", True)),
        ("deny", _remote("remote_decide", False)),
    ):
        flags.add_client_flags(sub.choices[name])
        local = sub.choices[name].get_default("fn")
        sub.choices[name].set_defaults(fn=_or_service(local, remote))
    mcp_cli.add_commands(sub, common, _config)
    return parser


def _remote(name: str, *more: Any) -> Callable[[ServiceClient, argparse.Namespace], int]:
    """``actors.shells.client``'s ``name`` (imported when called), given ``more`` arguments."""

    def call(through: ServiceClient, args: argparse.Namespace) -> int:
        from actors.shells import client

        code: int = getattr(client, name)(through, args, *more)
        return code

    return call


def _or_service(
    local: Callable[[argparse.Namespace], int],
    remote: Callable[[ServiceClient, argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """A command that goes through the service on a served home (or ``--connect``)."""

    def run(args: argparse.Namespace) -> int:
        from actors.shells import client

        through = client.client_for(args, _config(args))
        if through is None:
            return local(args)
        try:
            return remote(through, args)
        finally:
            through.close()

    return run


class _Version(argparse.Action):
    """``--version``: looks the version up only when asked (importlib.metadata is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        print(f"loopd {_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def _version() -> str:
    """loopd's installed version: from the name of its ``.dist-info`` folder on ``sys.path``
    (what importlib.metadata would find first, without its 15-100 ms of imports), else from
    importlib.metadata (an egg-info install), else ``unknown`` (a source tree)."""
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("loopd-") and name.endswith(".dist-info"):
                return name.removeprefix("loopd-").removesuffix(".dist-info")
    import importlib.metadata

    try:
        return importlib.metadata.version("loopd")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def _tools_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="port tools to load: a PortTool or a list of them (repeatable)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loopd`` console script; a closed stdout (``| head``) ends quietly."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away: point stdout at nothing so the exit flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return code


def _bad_input() -> tuple[type[BaseException], ...]:
    """What ``loopd`` answers with its message and exit 2: imported only once one is raised
    (the modules that raise them are loaded by then)."""
    from actors.core.config import ConfigError
    from actors.shells.client import ServiceError
    from actors.stores.base import StoreError
    from actors.stores.lock import HomeInUse

    return (ConfigError, StoreError, HomeInUse, ServiceError, ValueError, TypeError, OSError)


def _main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "action", None) == "show" and not args.id:
        parser.error("sessions show needs a session ID")
    if args.command == "approvals" and args.timeout is not None and not args.wait:
        parser.error("approvals --timeout goes with --wait")
    try:
        code: int = args.fn(args)
    except BrokenPipeError:  # not bad input: main() ends it quietly
        raise
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, _bad_input()):
            raise
        from actors.core.text import escape_controls, redact

        text = str(exc)
        if "no such tool: " in text and hasattr(args, "tools"):
            text = f"{text}; {TOOLS_HINT}"
        # URL credentials and tokens never reach the terminal, nor do its control sequences.
        print(f"loopd: {escape_controls(redact(text))}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
