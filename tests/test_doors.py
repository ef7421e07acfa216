"""The doors of loopd (issue 9): what each refuses, before anything is stored, and what it never
does with hostile input (crash, hang, leave a session unreadable, leak a secret, drive a
terminal). docs/reliability.md lists the doors and points here."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import Config, ModelConfig, port_tool
from actors.core.config import ConfigError, HeartbeatConfig
from actors.core.text import REDACTED, escape_controls, redact
from actors.models.base import ModelFailure
from actors.models.wire import parse_answer
from actors.runtime import Runtime
from actors.shells.render import render_event
from actors.shells.repl import Helpers
from actors.stores.sqlite import DB_NAME, SessionStore
from actors.testing import RawResponse, call, reply
from actors.testing.model import ScriptedModel
from messages import (
    Inspect,
    ModelAnswered,
    ModelRequest,
    RunTurn,
    ScheduledTurn,
    StartTurn,
    TurnCompleted,
    TurnEnded,
    TurnFailed,
    Usage,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 10.0
FAST = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def stored_ids(home: Path) -> list[str]:
    if not (home / DB_NAME).exists():
        return []
    with SessionStore(home / DB_NAME) as store:
        return [info.id for info in store.list_sessions()]


# --- a child's id at a top-level door (item 3) ------------------------------------------------


def test_a_top_level_turn_on_a_childs_id_is_refused_and_nothing_is_stored(
    loopd_runtime, loopd_config
) -> None:
    rt = loopd_runtime([reply("forged")])
    for door in (
        lambda: rt.run_turn("sub-p-1", "pre-seed the child", timeout=WAIT),
        lambda: rt.send_turn("sub-p-1", "pre-seed the child"),
        lambda: Helpers(rt).send("sub-p-1", "pre-seed the child"),
        lambda: Helpers(rt).turn("sub-p-1", "pre-seed the child"),
    ):
        with pytest.raises(ValueError, match="children are opened only by their parents"):
            door()
    assert stored_ids(loopd_config.home_path) == []
    assert rt.model.requests == []


def test_the_real_child_then_runs_on_its_own_fresh_transcript(loopd_runtime) -> None:
    def script(request: ModelRequest):
        last = request.messages[-1]
        if request.session == "p" and last.role == "user":
            return call("subagent", task="the real task")
        return reply(f"{request.session} saw {len(request.messages)} messages")

    rt = loopd_runtime(script)
    with pytest.raises(ValueError):
        rt.run_turn("sub-p-1", "forged history", timeout=WAIT)
    outcome = rt.run_turn("p", "go", timeout=WAIT)
    assert outcome == TurnCompleted("p", "p saw 4 messages")
    child = [r for r in rt.model.requests if r.session == "sub-p-1"]
    assert [m.role for m in child[0].messages] == ["system", "user"]
    assert "the real task" in (child[0].messages[-1].content or "")


def test_messages_built_or_decoded_directly_refuse_a_childs_id() -> None:
    with pytest.raises(ValueError, match="children are opened only"):
        StartTurn("sub-p-1", "x")
    with pytest.raises(ValueError, match="children are opened only"):
        ScheduledTurn("cron:0:x", "sub-p-1", "x")
    wire = b'{"type":"StartTurn","session":"sub-p-1","text":"x"}'
    with pytest.raises(msgspec.ValidationError, match="children are opened only"):
        msgspec.json.decode(wire, type=StartTurn)


@pytest.mark.parametrize("table", ["cron", "heartbeat"])
def test_a_scheduled_job_on_a_childs_id_is_refused_in_the_config(table: str) -> None:
    text = (
        '[[cron]]\nsession = "sub-p-1"\nschedule = "* * * * *"\nprompt = "x"\n'
        if table == "cron"
        else '[heartbeat]\nsession = "sub-p-1"\nevery_s = 60\n'
    )
    with pytest.raises(ConfigError, match=rf"{table}.session: .*opened only by their parents"):
        Config.from_toml(text)


# --- turn text and speaker (item 4) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "speaker", "error"),
    [
        (7, None, TypeError),
        (None, None, TypeError),
        (b"bytes", None, TypeError),
        (["a", "list"], None, TypeError),
        ("ok", 7, TypeError),
        ("ok", b"ann", TypeError),
        ("lone \ud800 surrogate", None, ValueError),
        ("ok", "ann\udfff", ValueError),
    ],
)
def test_bad_turn_text_or_speaker_is_refused_before_anything_is_stored(
    loopd_runtime, loopd_config, text: Any, speaker: Any, error: type[Exception]
) -> None:
    rt = loopd_runtime([reply("fine")])
    with pytest.raises(error):
        rt.run_turn("s", text, timeout=WAIT, speaker=speaker)
    with pytest.raises(error):
        rt.send_turn("s", text, speaker=speaker)
    with pytest.raises(error):
        RunTurn(text, speaker)
    assert stored_ids(loopd_config.home_path) == []
    # The session is untouched and works.
    assert rt.run_turn("s", "hello", timeout=WAIT, speaker="ann") == TurnCompleted("s", "fine")


def test_a_start_turn_decoded_with_a_number_for_text_is_refused() -> None:
    wire = b'{"type":"StartTurn","session":"s","text":7}'
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(wire, type=StartTurn)


@FAST
@given(
    text=st.one_of(
        st.text(),
        st.integers(),
        st.none(),
        st.binary(),
        st.lists(st.text(max_size=3), max_size=3),
        st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1),
    ),
    speaker=st.one_of(st.none(), st.text(max_size=20), st.integers(), st.binary(max_size=4)),
)
def test_any_turn_text_and_speaker_end_in_an_answer_or_a_clear_refusal(
    tmp_path_factory: pytest.TempPathFactory, text: Any, speaker: Any
) -> None:
    home = tmp_path_factory.mktemp("home")
    with Runtime.start(Config(home=home), model=ScriptedModel(lambda r: reply("ok"))) as rt:
        try:
            outcome = rt.run_turn("s", text, timeout=WAIT, speaker=speaker)
        except (TypeError, ValueError):
            assert stored_ids(home) == []
        else:
            assert outcome == TurnCompleted("s", "ok")
        # Whatever came in, the session is readable and runs again.
        assert rt.run_turn("s", "again", timeout=WAIT) == TurnCompleted("s", "ok")
    with SessionStore(home / DB_NAME) as store:
        store.open("s")
        store.history("s")


@FAST
@given(session=st.one_of(st.text(max_size=70), st.integers(), st.none()))
def test_any_session_id_is_used_exactly_or_refused(
    tmp_path_factory: pytest.TempPathFactory, session: Any
) -> None:
    home = tmp_path_factory.mktemp("home")
    with Runtime.start(Config(home=home), model=ScriptedModel(lambda r: reply("ok"))) as rt:
        try:
            outcome = rt.run_turn(session, "hi", timeout=WAIT)
        except ValueError:
            assert stored_ids(home) == []
            return
        assert outcome == TurnCompleted(session, "ok")
    assert stored_ids(home) == [session]


# --- timeouts at the Python door (item 8) -----------------------------------------------------


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e308, -1, 0, True, "5"])
def test_run_turn_refuses_a_timeout_that_is_not_finite_seconds(
    loopd_runtime, loopd_config, timeout: Any
) -> None:
    rt = loopd_runtime([reply("x")])
    with pytest.raises(ValueError, match="timeout"):
        rt.run_turn("s", "hi", timeout=timeout)
    assert stored_ids(loopd_config.home_path) == []


# --- the API key and URL credentials (item 7) -------------------------------------------------

KEY = "sk-live-0123456789abcdef"


def everything_written(events: list[Any], outcome: Any, caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(
        [
            *(msgspec.json.encode(e).decode() for e in events),
            msgspec.json.encode(outcome).decode(),
            caplog.text,
        ]
    )


def test_a_key_with_a_trailing_newline_is_stripped(chat_server, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOOPD_TEST_KEY", f"  {KEY}\r\n")
    server = chat_server([reply("hi")])
    model = ModelConfig(base_url=server.base_url, api_key_env="LOOPD_TEST_KEY", retries=0)
    with Runtime.start(Config(home=tmp_path / "home", model=model)) as rt:
        assert rt.run_turn("s", "hello", timeout=WAIT) == TurnCompleted(
            "s", "hi", usage=unmeasured(1)
        )
    assert server.request_headers[0]["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("bad", ["sk-\x01live", "sk-livé", "sk-live\r\nX-Evil: 1", "sk\x7f"])
def test_a_key_with_a_control_or_non_ascii_character_is_refused_at_start(
    tmp_path, monkeypatch, bad: str
) -> None:
    monkeypatch.setenv("LOOPD_TEST_KEY", bad)
    model = ModelConfig(api_key_env="LOOPD_TEST_KEY")
    with pytest.raises(ConfigError) as caught:
        Runtime.start(Config(home=tmp_path / "home", model=model))
    text = str(caught.value)
    assert "LOOPD_TEST_KEY" in text
    assert bad.strip() not in text and "sk" not in text


def test_a_server_that_echoes_the_key_and_url_credentials_never_reaches_any_text(
    chat_server, tmp_path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("LOOPD_TEST_KEY", KEY)
    echo = b'{"error": "invalid token sk-live-0123456789abcdef (Authorization: Bearer %s)"}' % (
        KEY.encode()
    )
    server = chat_server([RawResponse(status=401, body=echo)])
    base = server.base_url.replace("http://", "http://ann:hunter2@")
    model = ModelConfig(base_url=base, api_key_env="LOOPD_TEST_KEY", retries=0)
    events: list[Any] = []
    ended = threading.Event()
    with (
        caplog.at_level(logging.DEBUG),
        Runtime.start(Config(home=tmp_path / "h", model=model)) as rt,
    ):
        rt.subscribe(lambda e: (events.append(e), isinstance(e, TurnEnded) and ended.set()))
        outcome = rt.run_turn("s", "hello", timeout=WAIT)
        assert ended.wait(WAIT)
    assert isinstance(outcome, TurnFailed) and "401" in outcome.detail
    written = everything_written(events, outcome, caplog)
    assert KEY not in written
    assert "hunter2" not in written and "ann:" not in written
    assert REDACTED in outcome.detail


def test_a_client_failure_log_and_detail_are_redacted(tmp_path, monkeypatch, caplog) -> None:
    class Leaky:
        def complete(self, request: ModelRequest) -> Any:
            raise RuntimeError(f"Illegal header value b'Bearer {KEY}\\r'")

        def close(self) -> None:
            pass

    from actors import runtime

    monkeypatch.setenv("LOOPD_TEST_KEY", KEY)
    config = Config(home=tmp_path / "h", model=ModelConfig(api_key_env="LOOPD_TEST_KEY"))
    monkeypatch.setattr(runtime, "HttpChatModel", lambda cfg: Leaky())
    with caplog.at_level(logging.DEBUG), Runtime.start(config) as rt:
        outcome = rt.run_turn("s", "hi", timeout=WAIT)
    assert isinstance(outcome, TurnFailed)
    assert KEY not in outcome.detail and KEY not in caplog.text
    assert "model client failed" in caplog.text


def test_redact_removes_secrets_userinfo_and_bearer_tokens() -> None:
    text = "GET http://u:p%40ss@h:1/v1 failed; Authorization: Bearer abc.def; key=s3cr3t"
    assert redact(text, ["s3cr3t", ""]) == (
        f"GET http://{REDACTED}@h:1/v1 failed; Authorization: Bearer {REDACTED}; key={REDACTED}"
    )


# --- files that block or never end (item 9) ---------------------------------------------------


def test_a_memory_fifo_fails_the_new_session_at_once_and_does_not_block(
    loopd_runtime, loopd_config
) -> None:
    home = loopd_config.home_path
    home.mkdir(parents=True)
    os.mkfifo(home / "MEMORY.md")
    rt = loopd_runtime([reply("x")])
    outcome = rt.run_turn("s", "hi", timeout=WAIT)
    assert isinstance(outcome, TurnFailed) and outcome.reason == "spawn_error"
    assert "not a regular file (it is a FIFO)" in outcome.detail


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "huge"])
def test_config_load_reads_only_a_bounded_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "loopd.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(ConfigError, match=r"not a regular file|larger than 1048576 bytes"):
        Config.load(path)


# --- terminal escapes (item 10) ---------------------------------------------------------------

HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\x9b31mred\x1b[0m\nnext line"


def test_event_lines_show_control_characters_escaped() -> None:
    line = render_event(ModelAnswered(session="s", step=1, content=HOSTILE))
    assert "\x1b" not in line and "\x07" not in line and "\x9b" not in line
    assert "\n" not in line
    assert "\\x1b]0;PWNED\\x07" in line
    failed = render_event(TurnEnded(session="s", completed=False, detail="a\x1b[2Jb\nc"))
    assert failed.endswith("a\\x1b[2Jb⏎c")


def test_escape_controls_keeps_ordinary_text_and_newlines() -> None:
    assert escape_controls("tea ☕\tand\nmore") == "tea ☕\tand\nmore"
    assert escape_controls(HOSTILE) == ("\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31mred\\x1b[0m\nnext line")
    assert escape_controls("\ud800") == "\\ud800"


@FAST
@given(st.text())
def test_escaped_text_has_no_control_character_a_terminal_acts_on(text: str) -> None:
    shown = escape_controls(text, one_line=True)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    shown.encode("utf-8")  # printable on any UTF-8 terminal, no lone surrogate


# --- model answers (item 11, and hypothesis) --------------------------------------------------


def test_a_deeply_nested_answer_is_a_model_failure_not_a_recursion_error() -> None:
    with pytest.raises(ModelFailure, match="nested deeper than 64 levels"):
        parse_answer("s", 1, b"[" * 200_000 + b"]" * 200_000)


def test_a_deeply_nested_answer_over_http_ends_the_turn_with_model_error(
    chat_server, tmp_path
) -> None:
    server = chat_server([RawResponse(body=b'{"choices": ' + b"[" * 200_000)])
    model = ModelConfig(base_url=server.base_url, retries=0)
    with Runtime.start(Config(home=tmp_path / "h", model=model)) as rt:
        outcome = rt.run_turn("s", "hi", timeout=WAIT)
    assert isinstance(outcome, TurnFailed) and outcome.reason == "model_error"
    assert "nested deeper than 64 levels" in outcome.detail


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
answer_shapes = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries(
                    {
                        "message": st.one_of(
                            json_values,
                            st.fixed_dictionaries(
                                {
                                    "content": st.one_of(st.none(), st.text(), json_values),
                                    "tool_calls": st.one_of(
                                        st.none(),
                                        json_values,
                                        st.lists(
                                            st.fixed_dictionaries(
                                                {
                                                    "function": st.one_of(
                                                        json_values,
                                                        st.fixed_dictionaries(
                                                            {
                                                                "name": json_values,
                                                                "arguments": json_values,
                                                            }
                                                        ),
                                                    )
                                                }
                                            ),
                                            max_size=3,
                                        ),
                                    ),
                                }
                            ),
                        )
                    }
                ),
                max_size=2,
            )
        }
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(answer_shapes.map(msgspec.json.encode), st.binary(max_size=64)))
def test_any_model_answer_parses_or_is_a_model_failure(body: bytes) -> None:
    try:
        answer = parse_answer("s", 1, body)
    except ModelFailure as exc:
        assert str(exc)
        return
    assert answer.content is None or isinstance(answer.content, str)
    for proposed in answer.tool_calls:
        assert isinstance(proposed.name, str) and proposed.name
        assert isinstance(proposed.arguments, str)


def test_a_heartbeat_fifo_is_skipped_with_a_warning_and_does_not_block(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    os.mkfifo(home / "HEARTBEAT.md")
    warned = threading.Event()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "not a regular file (it is a FIFO)" in record.getMessage():
                warned.set()

    handler = Catch(logging.WARNING)
    logging.getLogger("actors.services.scheduler").addHandler(handler)
    try:
        config = Config(home=home, heartbeat=HeartbeatConfig(session="watch", every_s=60))
        rt = Runtime.start(config, model=ScriptedModel([reply("x")]))
        try:
            assert warned.wait(WAIT)  # the first tick comes after a second
            # The scheduler still answers: it is not stuck in open().
            assert rt.run_turn("other", "hi", timeout=WAIT) == TurnCompleted("other", "x")
        finally:
            rt.stop()
    finally:
        logging.getLogger("actors.services.scheduler").removeHandler(handler)
    assert stored_ids(home) == ["other"]


def test_a_port_tool_that_returns_a_lone_surrogate_gets_an_error_text(loopd_runtime) -> None:
    @port_tool("broken", "Returns text that is not valid Unicode.")
    def broken(args: dict[str, Any]) -> str:
        return "half a pair: \ud800"

    def script(request: ModelRequest):
        last = request.messages[-1]
        if last.role == "user":
            return call("broken")
        return reply(last.content or "")

    rt = loopd_runtime(script, tools=[broken])
    outcome = rt.run_turn("s", "go", timeout=WAIT)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.content.startswith("Error: the tool broken failed: ValueError:")
    assert "not valid Unicode text" in outcome.content
    assert rt.run_turn("s", "again", timeout=WAIT).session == "s"  # still readable


def test_the_repl_shows_model_text_escaped(loopd_runtime, capsys) -> None:
    rt = loopd_runtime([reply(HOSTILE)])
    helpers = Helpers(rt)
    outcome = helpers.turn("s", "hi")
    helpers.show("s")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out
    assert "\\x1b]0;PWNED\\x07" in out  # the event line and the transcript
    assert "\x1b" not in repr(outcome)  # what the console prints for the returned outcome
    assert isinstance(outcome, TurnCompleted) and outcome.content == HOSTILE  # kept as it was


@settings(max_examples=25, deadline=None)
@given(body=st.one_of(answer_shapes.map(msgspec.json.encode), st.binary(max_size=64)))
def test_any_answer_over_http_ends_the_turn_and_leaves_the_session_readable(body: bytes) -> None:
    import tempfile

    from actors.testing import ChatServer

    sent = threading.Event()

    def script(request: dict[str, Any]) -> Any:
        if sent.is_set():
            return reply("fine")  # every later request: whatever the first answer started
        sent.set()
        return RawResponse(body=body)

    with tempfile.TemporaryDirectory() as scratch, ChatServer(script) as server:
        model = ModelConfig(base_url=server.base_url, retries=0)
        with Runtime.start(Config(home=scratch, model=model)) as rt:
            outcome = rt.run_turn("s", "hi", timeout=WAIT)
            if isinstance(outcome, TurnFailed):
                assert outcome.reason == "model_error" and outcome.detail
                assert rt.run_turn("s", "again", timeout=WAIT) == TurnCompleted(
                    "s", "fine", usage=unmeasured(1)
                )
        with SessionStore(Path(scratch) / DB_NAME) as store:
            store.open("s")
            store.history("s")


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1, 0])
def test_cancel_and_the_repls_ask_refuse_a_timeout_that_is_not_finite_seconds(
    loopd_runtime, timeout: float
) -> None:
    rt = loopd_runtime([reply("x")])
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        rt.cancel("s", timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        Helpers(rt).ask("context", Inspect(), timeout=timeout)
