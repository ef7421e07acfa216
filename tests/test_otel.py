"""OpenTelemetry spans: a turn, its model requests, its tool calls and its children, one tree."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from actors import ModelConfig, port_tool
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import ScriptedModel, call, reply
from actors.tracing.base import GuardedTracer
from actors.tracing.otel import OtelTracer
from messages import (
    FailReason,
    ModelRequest,
    StartTurn,
    SubagentRequest,
    SubagentStarted,
    ToolCallStarted,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    TurnStarted,
)

WAIT = 10.0


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in finished}


@port_tool("weather", "The weather.")
def weather(args):
    return "sunny"


def test_a_turn_with_a_tool_and_a_child_is_one_tree_under_the_callers_span(
    loopd_runtime, loopd_config, spans
) -> None:
    provider, exporter = spans

    def script(request: ModelRequest):
        last = request.messages[-1]
        if request.session == "boss":
            if last.role == "user":
                return call("weather")
            if last.content == "sunny":
                return call("subagent", task="dig")
            return reply("all done")
        return reply("dug")

    config = loopd_config.replace(model=ModelConfig(name="local-model"))
    rt = loopd_runtime(
        script, config=config, tools=[weather], tracer=OtelTracer(tracer_provider=provider)
    )
    caller = provider.get_tracer("the-app")
    with caller.start_as_current_span("POST /chat") as request_span:
        outcome = rt.run_turn("boss", "go", timeout=WAIT)
    assert outcome == TurnCompleted("boss", "all done")
    rt.stop()

    finished = exporter.get_finished_spans()
    named = by_name(finished)
    turn = named["invoke_agent boss"]
    tool = named["execute_tool weather"]
    spawn = named["execute_tool subagent"]
    child = named["invoke_agent sub-boss-2"]
    chats = [s for s in finished if s.name == "chat local-model"]
    # One trace, rooted at the caller's span.
    trace_id = request_span.get_span_context().trace_id
    assert {s.context.trace_id for s in finished} == {trace_id}
    assert turn.parent.span_id == request_span.get_span_context().span_id
    assert tool.parent.span_id == turn.context.span_id
    assert spawn.parent.span_id == turn.context.span_id
    # The child ran in another actor, yet its turn hangs under the parent's tool-call span.
    assert child.parent.span_id == spawn.context.span_id
    # Three model requests of the boss and one of the child, each under its own turn.
    assert len(chats) == 4
    assert sorted(s.parent.span_id == child.context.span_id for s in chats) == [
        False,
        False,
        False,
        True,
    ]
    # GenAI semantic conventions.
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.conversation.id"] == "boss"
    assert chats[0].kind is SpanKind.CLIENT
    assert chats[0].attributes["gen_ai.operation.name"] == "chat"
    assert chats[0].attributes["gen_ai.request.model"] == "local-model"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "weather"
    assert tool.attributes["gen_ai.tool.call.id"] == "1"
    assert spawn.attributes["loopd.child"] == "sub-boss-2"
    assert all(s.status.status_code is not StatusCode.ERROR for s in finished)


def test_a_failed_turn_ends_its_spans_with_an_error(loopd_runtime, spans) -> None:
    provider, exporter = spans
    rt = loopd_runtime(
        [call("weather"), call("weather")],
        loop={"max_steps": 2},
        tools=[weather],
        tracer=OtelTracer(tracer_provider=provider),
    )
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.TURN_LIMIT
    rt.stop()
    named = by_name(exporter.get_finished_spans())
    turn = named["invoke_agent s"]
    assert turn.status.status_code is StatusCode.ERROR
    assert turn.attributes["error.type"] == "turn_limit"
    # A turn without a caller's span is a root.
    assert turn.parent is None


def test_the_trace_context_is_plain_data_in_the_messages() -> None:
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    for message in (
        StartTurn("s", "hi", trace=carrier),
        SubagentRequest("s", 1, "task", trace=carrier),
    ):
        assert msgspec.json.decode(msgspec.json.encode(message), type=type(message)) == message
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=type(message)) == (
            message
        )


def test_without_opentelemetry_nothing_of_it_is_imported(tmp_path: Path) -> None:
    """A process where opentelemetry cannot be found runs turns and never imports it."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the package were not installed
        from actors import Config, Runtime
        from actors.testing import ScriptedModel, reply
        from actors.tracing.base import NoTracer
        model = ScriptedModel([reply("ok")])
        with Runtime.start(Config(home={str(tmp_path)!r}), model=model) as rt:
            assert rt.run_turn("s", "hi", timeout=10).content == "ok"
            assert isinstance(rt.tracer, NoTracer)
        loaded = [m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v]
        assert not loaded, loaded
        print("clean")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "clean"


def test_until_the_application_sets_a_provider_no_span_is_made() -> None:
    """With the API installed but no provider set, events are passed over (no span objects
    kept per turn); once the application sets a provider, the next turn is traced."""
    code = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from actors.tracing.otel import OtelTracer
        from messages import TurnEnded, TurnStarted
        tracer = OtelTracer()
        tracer.on_event(TurnStarted(session="a", slot=0), None)
        assert not tracer.recording() and tracer._turns == {}, tracer._turns
        tracer.on_event(TurnEnded(session="a", completed=True), None)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert tracer.recording()
        tracer.on_event(TurnStarted(session="b", slot=0), None)
        tracer.on_event(TurnEnded(session="b", completed=True), None)
        print([span.name for span in exporter.get_finished_spans()])
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['invoke_agent b']"


def test_with_opentelemetry_installed_the_default_tracer_is_otels(loopd_runtime) -> None:
    rt = loopd_runtime([reply("ok")])
    assert isinstance(rt.tracer.inner, OtelTracer)


def test_a_chat_span_carries_the_tokens_the_server_reported(loopd_runtime, loopd_config, spans):
    import json

    from actors.testing import ChatServer, RawResponse

    provider, exporter = spans
    body = {
        "id": "c1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
    }
    raw = RawResponse(body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with ChatServer([raw]) as server:
        model = ModelConfig(base_url=server.base_url, name="m")
        rt = loopd_runtime(
            config=loopd_config.replace(model=model), tracer=OtelTracer(tracer_provider=provider)
        )
        outcome = rt.run_turn("s", "hello", timeout=WAIT)
        assert isinstance(outcome, TurnCompleted) and outcome.content == "hi"
        rt.stop()
    chat = by_name(exporter.get_finished_spans())["chat m"]
    assert chat.attributes["gen_ai.usage.input_tokens"] == 42
    assert chat.attributes["gen_ai.usage.output_tokens"] == 7
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)


class Failing(SpanProcessor):
    """A span processor that raises ``error``, in ``on_start`` or in ``on_end``."""

    def __init__(self, where: str, error: type[BaseException] = RuntimeError) -> None:
        self.where = where
        self.error = error

    def on_start(self, span, parent_context=None) -> None:
        if self.where == "on_start":
            raise self.error("the processor broke at on_start")

    def on_end(self, span) -> None:
        if self.where == "on_end":
            raise self.error("the processor broke at on_end")


class Odd(BaseException):
    """Neither an Exception nor SystemExit: what a careless library might raise."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [RuntimeError, SystemExit, GeneratorExit, Odd])
@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_span_processor_that_raises_changes_no_outcome(
    loopd_runtime, loopd_config, where, error, caplog
) -> None:
    """Issue 19 A4, issue 32 A23: a turn with a tool call and a child completes, its transcript
    is whole, and the failure is logged once, though every span start (or end) raises, be it
    an Exception or any other BaseException but KeyboardInterrupt (SystemExit included)."""
    provider = TracerProvider()
    provider.add_span_processor(Failing(where, error))

    def script(request: ModelRequest):
        last = request.messages[-1]
        if request.session == "boss":
            if last.role == "user":
                return call("weather")
            if last.content == "sunny":
                return call("subagent", task="dig")
            return reply("all done")
        return reply("dug")

    rt = loopd_runtime(script, tools=[weather], tracer=OtelTracer(tracer_provider=provider))
    with caplog.at_level(logging.DEBUG, logger="loopd.tracing"):
        assert rt.run_turn("boss", "go", timeout=WAIT) == TurnCompleted("boss", "all done")
        assert rt.run_turn("boss", "again", timeout=WAIT) == TurnCompleted("boss", "all done")
    rt.stop()
    with SessionStore(loopd_config.home_path / DB_NAME) as store:
        history = [h.message for h in store.history("boss")]
    # Every tool result follows the assistant message that carries its call.
    calls: set[str] = set()
    for message in history:
        calls.update(c.id for c in message.tool_calls or ())
        if message.role == "tool":
            assert message.tool_call_id in calls, history
    assert [m.content for m in history if m.role == "assistant" and m.content] == [
        "all done",
        "all done",
    ]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "the tracer OtelTracer failed" in warnings[0].getMessage()
    assert rt.tracer.failures > 1


def test_a_keyboard_interrupt_in_a_span_processor_is_not_swallowed() -> None:
    """The one BaseException the guard lets through: a person's Ctrl-C."""
    provider = TracerProvider()
    provider.add_span_processor(Failing("on_start", KeyboardInterrupt))
    tracer = GuardedTracer(OtelTracer(tracer_provider=provider))
    with pytest.raises(KeyboardInterrupt):
        tracer.on_event(TurnStarted(session="s", slot=0), None)
    assert tracer.failures == 0


def test_a_broken_opentelemetry_means_no_tracing_and_one_warning(tmp_path: Path) -> None:
    """Issue 19 A13: an opentelemetry found on the path whose import raises ImportError (a
    broken or mismatched install) fails no start; two starts give one warning."""
    broken = tmp_path / "site" / "opentelemetry"
    (broken / "trace").mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "trace" / "__init__.py").write_text("raise ImportError('cannot import name Span')\n")
    code = textwrap.dedent(
        f"""
        import logging, sys
        sys.path.insert(0, {str(tmp_path / "site")!r})
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
        from actors import Config, Runtime
        from actors.testing import ScriptedModel, reply
        from actors.tracing.base import NoTracer
        for home in ("a", "b"):
            model = ScriptedModel([reply("ok")])
            config = Config(home={str(tmp_path)!r} + "/" + home)
            with Runtime.start(config, model=model) as rt:
                assert rt.run_turn("s", "hi", timeout=10).content == "ok"
                assert isinstance(rt.tracer, NoTracer)
        print("started twice")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started twice"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        "WARNING loopd: OpenTelemetry is installed but cannot be loaded "
        "(ImportError: cannot import name Span); tracing is off"
    ], done.stderr


def test_spans_events_and_the_session_list_name_each_sessions_profile(
    loopd_runtime, loopd_config, spans, capsys
) -> None:
    """Issue 19 B6: a profile's spans name its own model, ``gen_ai.agent.name`` is the profile
    (the session id is ``gen_ai.conversation.id``), the events name the profile a turn and a
    child run, and ``loopd sessions --json`` has each session's ``agent``."""
    from actors import AgentConfig
    from actors.shells.cli import main

    provider, exporter = spans

    def script(request: ModelRequest):
        if request.session == "boss" and request.messages[-1].role == "user":
            return call("subagent", task="dig", agent="small")
        return reply(f"done {request.session}")

    config = loopd_config.replace(
        model=ModelConfig(name="big-model"),
        agents={"small": AgentConfig(model="small-model", description="A small one.")},
    )
    model = ScriptedModel(script)
    rt = loopd_runtime(model=model, config=config, tracer=OtelTracer(tracer_provider=provider))
    events: list[object] = []
    rt.subscribe(events.append)
    assert rt.run_turn("boss", "go", timeout=WAIT) == TurnCompleted("boss", "done boss")
    assert rt.run_turn("solo", "hi", timeout=WAIT, agent="small").content == "done solo"
    rt.stop()

    sent = {(r.session, r.options.model) for r in model.requests}
    assert sent == {("boss", None), ("sub-boss-1", "small-model"), ("solo", "small-model")}
    finished = exporter.get_finished_spans()
    chats = {
        (s.parent.span_id, s.name, s.attributes["gen_ai.request.model"])
        for s in finished
        if s.name.startswith("chat ")
    }
    named = by_name(finished)
    turns = {
        session: named[f"invoke_agent {session}"] for session in ("boss", "sub-boss-1", "solo")
    }
    for session, agent, model_name in [
        ("boss", "default", "big-model"),
        ("sub-boss-1", "small", "small-model"),
        ("solo", "small", "small-model"),
    ]:
        turn = turns[session]
        assert turn.attributes["gen_ai.agent.name"] == agent
        assert turn.attributes["gen_ai.conversation.id"] == session
        assert turn.attributes["loopd.session"] == session
        assert turn.attributes["gen_ai.request.model"] == model_name
        span_id = turn.context.span_id
        assert (span_id, f"chat {model_name}", model_name) in chats
        assert not any(c[0] == span_id and c[2] != model_name for c in chats)
    assert named["execute_tool subagent"].attributes["loopd.child.agent"] == "small"
    started = {e.session: e.agent for e in events if isinstance(e, TurnStarted)}
    assert started == {"boss": "default", "sub-boss-1": "small", "solo": "small"}
    [spawned] = [e for e in events if isinstance(e, SubagentStarted)]
    assert (spawned.child, spawned.agent) == ("sub-boss-1", "small")

    capsys.readouterr()
    assert main(["sessions", "--json", "--home", config.home]) == 0
    rows = [msgspec.json.decode(line) for line in capsys.readouterr().out.splitlines()]
    assert {row["id"]: row["agent"] for row in rows} == {
        "boss": "default",
        "sub-boss-1": "small",
        "solo": "small",
    }


def test_a_global_provider_whose_processor_raises_changes_no_outcome(tmp_path: Path) -> None:
    """Issue 19 A4 with the application's global provider (the default tracer's), in a fresh
    process since the global provider can be set only once."""
    code = textwrap.dedent(
        f"""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from actors import Config, Runtime
        from actors.testing import ScriptedModel, call, reply

        class Failing(SpanProcessor):
            def on_start(self, span, parent_context=None):
                raise RuntimeError("on_start broke")

            def on_end(self, span):
                raise RuntimeError("on_end broke")

        provider = TracerProvider()
        provider.add_span_processor(Failing())
        trace.set_tracer_provider(provider)
        model = ScriptedModel([call("subagent", task="dig"), reply("dug"), reply("done")])
        with Runtime.start(Config(home={str(tmp_path)!r}), model=model) as rt:
            print(rt.run_turn("s", "go", timeout=10).content, rt.tracer.failures > 0)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done True"
    assert done.stderr.count("the tracer OtelTracer failed") == 1, done.stderr


def test_a_processor_failing_at_one_span_leaves_the_turns_other_spans_whole(caplog) -> None:
    """Issue 19 A4: when ending one span of a turn raises (a cancelled turn's open call), the
    turn's own span still ends and is exported."""
    exporter = InMemorySpanExporter()

    class FailsAtTools(SimpleSpanProcessor):
        def on_end(self, span) -> None:
            if span.name.startswith("execute_tool"):
                raise RuntimeError("this exporter hates tools")
            super().on_end(span)

    provider = TracerProvider()
    provider.add_span_processor(FailsAtTools(exporter))
    tracer = GuardedTracer(OtelTracer(tracer_provider=provider))
    tracer.on_event(TurnStarted(session="s", slot=0), None)
    tracer.on_event(ToolCallStarted(session="s", call_id=1, name="slow"), None)
    tracer.on_event(TurnEnded(session="s", completed=False, reason=FailReason.CANCELLED), None)
    assert [s.name for s in exporter.get_finished_spans()] == ["invoke_agent s"]
    assert tracer.failures == 1
