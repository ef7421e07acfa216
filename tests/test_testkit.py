"""The test kit itself: the probe, the scripted model and the fake server behave as documented,
and fail with messages that say what happened."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from actors import Config, Directory, ModelConfig, ModelFailure, Runtime, SlotsConfig
from actors.core.config import AgentConfig
from actors.models.offline import ENV_VAR, RealModelForbidden
from actors.testing import ChatServer, Probe, RawResponse, ScriptedModel, call, calls, reply
from actors.testing.probe import Terminated
from actors.testing.script_file import FileScript, first_user_text, load_script
from messages import ModelRequest, ProposedCall, TurnCompleted, TurnFailed, Usage


def request(session: str = "s", n: int = 1) -> ModelRequest:
    return ModelRequest(session, n, 0, (), (), "nowhere")


def test_a_failed_expectation_names_what_did_arrive() -> None:
    probe = Probe.start()
    try:
        probe.tell(TurnCompleted("s", "hello"))
        probe.next()
        probe.tell("something else")
        with pytest.raises(AssertionError) as failure:
            probe.expect(TurnFailed, timeout=0.1)
        text = str(failure.value)
        assert "expected a TurnFailed within 0.1 s" in text
        assert "2 message(s)" in text
        assert "(taken) TurnCompleted(session='s', content='hello')" in text
        assert "'something else'" in text
    finally:
        probe.stop()


def test_expect_takes_the_first_match_and_leaves_the_rest() -> None:
    probe = Probe.start()
    try:
        for message in ("a", TurnCompleted("s", "1"), "b", TurnCompleted("s", "2")):
            probe.tell(message)
        assert probe.expect(TurnCompleted).content == "1"
        assert probe.expect(lambda m: m == "b") == "b"
        assert probe.next() == "a"
        assert probe.expect_all(TurnCompleted, 1)[0].content == "2"
        assert len(probe.received) == 4
    finally:
        probe.stop()


def test_expect_none_fails_when_something_arrives() -> None:
    probe = Probe.start()
    try:
        probe.expect_none(within=0.05)
        threading.Timer(0.01, probe.tell, ["late"]).start()
        with pytest.raises(AssertionError, match=r"expected no message within 1\.0 s"):
            probe.expect_none(within=1.0)
        probe.expect_none(within=0.05, what=TurnFailed)
    finally:
        probe.stop()


def test_a_probe_has_an_address_in_a_directory() -> None:
    directory = Directory()
    probe = Probe.start(directory)
    try:
        assert directory.tell(probe.address, "hi")
        assert probe.next() == "hi"
    finally:
        probe.stop()
    assert directory.get(probe.address) is None
    assert not directory.tell(probe.address, "after") and directory.dead_letters == 1


def test_a_scripted_model_answers_in_order_records_and_runs_out() -> None:
    model = ScriptedModel([reply("one"), call("clock"), calls(("a", "{}"), ("b", {"x": 1}))])
    assert model.complete(request(n=1)).content == "one"
    assert model.complete(request(n=2)).tool_calls == (ProposedCall("clock", "{}"),)
    third = model.complete(request(n=3))
    assert third.tool_calls == (ProposedCall("a", "{}"), ProposedCall("b", '{"x": 1}'))
    assert third.request_id == 3 and third.session == "s"
    with pytest.raises(ModelFailure, match="ran out of answers after 3"):
        model.complete(request(n=4))
    assert [r.request_id for r in model.requests] == [1, 2, 3, 4]


def test_a_scripted_model_function_sees_the_request() -> None:
    model = ScriptedModel(lambda r: reply(f"hi {r.session}"))
    assert model.complete(request("ana")).content == "hi ana"
    with pytest.raises(AssertionError, match=r"expected 2 model requests within 0\.05 s, got 1"):
        model.wait_for_requests(2, timeout=0.05)


def test_the_fake_server_speaks_chat_completions_and_records(chat_server) -> None:
    server = chat_server([call("clock"), RawResponse(418, b"teapot")])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    first = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5).json()
    message = first["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "clock", "arguments": "{}"}
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    teapot = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5)
    assert (teapot.status_code, teapot.content) == (418, b"teapot")
    ran_out = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5)
    assert ran_out.status_code == 500
    assert server.requests == [body, body, body]
    assert any("ran out" in error for error in server.errors)


def test_the_chat_server_fixture_takes_the_servers_arguments(chat_server, tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    server = chat_server([reply("logged")], total_slots=3, log=log)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5)
    props = httpx.get(f"{server.base_url.removesuffix('/v1')}/props", timeout=5).json()
    assert props["total_slots"] == 3
    assert [json.loads(line)["path"] for line in log.read_text().splitlines()] == [
        "/v1/chat/completions",
        "/props",
    ]


def test_the_fixtures_start_and_stop_a_runtime(loopd_runtime, probe) -> None:
    rt = loopd_runtime([reply("ok")], loop={"max_steps": 3})
    assert rt.config.loop.max_steps == 3
    answers = probe(rt.directory)
    rt.send_turn("s", "hi", reply_to=answers.address)
    assert answers.expect(TurnCompleted).content == "ok"


def test_the_server_can_be_used_without_pytest() -> None:
    with ChatServer([reply("plain")]) as server:
        body = {"messages": []}
        answer = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5).json()
    assert answer["choices"][0]["message"]["content"] == "plain"


IN_FLIGHT = """
import threading

from actors import ModelConfig

never = threading.Event()


def hang(body):
    never.wait()  # the server never answers
    raise AssertionError("unreachable")


def test_leaves_a_model_request_in_flight(chat_server, loopd_runtime, loopd_config):
    server = chat_server(hang)
    model = ModelConfig(base_url=server.base_url, name="m", timeout_s=600)
    rt = loopd_runtime(config=loopd_config.replace(model=model))
    rt.send_turn("s", "hi")
    server.wait_for_requests(1, timeout=10)
"""


USERS_ACTOR = """
import pathlib

import pykka


class Users(pykka.ThreadingActor):
    use_daemon_thread = True  # the suite's own choice: it leaves this actor running

    def __init__(self, marker):
        super().__init__()
        self.marker = marker

    def on_stop(self):
        self.marker.write_text("stopped by someone")


def test_leaves_its_own_actor_running(tmp_path_factory):
    marker = tmp_path_factory.getbasetemp() / "users-actor-stopped"
    Users.start(marker)
"""


STUCK_TOOL = """
import threading

from actors import port_tool
from actors.testing import call, reply

started = threading.Event()
release = threading.Event()


@port_tool("block", "Blocks until the run ends.")
def block(args):
    started.set()
    release.wait(30)  # deaf to its cancel: busy past the kit's deadline
    return "done"


def test_leaves_a_tool_running(request, loopd_runtime):
    request.config.add_cleanup(release.set)  # after the plugin's sessionfinish
    rt = loopd_runtime([call("block"), reply("ok")], tools=[block])
    rt.send_turn("s", "go")
    assert started.wait(10)
"""


def test_a_run_whose_tests_leave_work_in_flight_exits_0_and_warns(
    pytester: pytest.Pytester,
) -> None:
    # One run, three tests: one leaves a model request on a server that never answers, one a
    # port tool busy past the kit's deadline, one an actor of the suite's own. All pass, and
    # so does the run; the kit warns about its own runtime's stuck worker and nothing else,
    # and leaves the suite's own actor alone.
    pytester.makepyfile(test_in_flight=IN_FLIGHT, test_stuck=STUCK_TOOL, test_users=USERS_ACTOR)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "loopd_stop_timeout=0.5", timeout=60
    )
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes()["passed"] == 3
    result.stdout.fnmatch_lines(
        [
            "*LoopdCleanupWarning: loopd's test kit could not stop 1 actor(s) of its fixtures"
            " within 0.5 s*(PoolWorker)*"
        ]
    )
    assert "Users" not in result.stdout.str()
    assert "Timeout" not in result.stdout.str() + result.stderr.str()
    assert not any(pytester.path.rglob("users-actor-stopped"))


# --- the kit's newer helpers: exact expectations, within, watch, assert_complete, the switch ---


def test_expect_an_exact_message_matches_by_equality() -> None:
    probe = Probe.start()
    try:
        probe.tell(TurnCompleted("s", "one"))
        probe.tell(TurnCompleted("s", "two"))
        assert probe.expect(TurnCompleted("s", "two")) == TurnCompleted("s", "two")
        with pytest.raises(AssertionError, match=r"expected a message equal to TurnCompleted\("):
            probe.expect(TurnCompleted("s", "three"), timeout=0.1)
        assert probe.next() == TurnCompleted("s", "one")
    finally:
        probe.stop()


def test_within_fails_a_block_that_overran_and_bounds_its_expectations() -> None:
    probe = Probe.start()
    gate = threading.Event()
    try:
        with probe.within(5.0):
            probe.tell("quick")
            assert probe.expect("quick") == "quick"
        # An expectation inside the block waits only for what is left of it, then the block
        # itself reports that it overran.
        with (
            pytest.raises(AssertionError, match=r"expected a str within 0\.\d+ s"),
            probe.within(0.2),
        ):
            probe.expect(str)
        with (
            pytest.raises(AssertionError, match=r"the block took .* more than 0\.05 s"),
            probe.within(0.05),
        ):
            gate.wait(0.1)  # stands for slow work under test
    finally:
        probe.stop()


def test_watch_expects_the_actors_stop() -> None:
    probe = Probe.start()
    other = Probe.start()
    try:
        probe.watch(other.ref)
        probe.expect_none(within=0.1)
        other.stop()
        assert probe.expect(Terminated(other.ref)).ref is other.ref
    finally:
        probe.stop()


def test_assert_complete_names_the_unused_answers() -> None:
    model = ScriptedModel([reply("one"), reply("two")])
    model.complete(request())
    with pytest.raises(AssertionError, match=r"used 1 of its 2 answers; unused: \[Answer"):
        model.assert_complete()
    model.complete(request(n=2))
    model.assert_complete()
    ScriptedModel(lambda r: reply("x")).assert_complete()


def test_the_switch_makes_a_runtime_for_a_real_model_fail_loudly(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    config = Config(home=str(tmp_path), model=ModelConfig(base_url="http://10.9.9.9:8080/v1"))
    with pytest.raises(RealModelForbidden, match=r"10\.9\.9\.9:8080/v1.*real models are forbidden"):
        Runtime.start(config)
    # The kit's own models stay allowed: a ScriptedModel, and a running ChatServer.
    Runtime.start(config, model=ScriptedModel([])).stop()
    with ChatServer([reply("fake but fine")]) as server:
        fake = config.replace(model=ModelConfig(base_url=server.base_url))
        with Runtime.start(fake) as rt:
            assert rt.run_turn("s", "hi", timeout=10) == TurnCompleted(
                "s", "fake but fine", usage=Usage(requests=1, unmeasured_requests=1)
            )
    with pytest.raises(RealModelForbidden):  # stopped: no longer a fake that serves
        Runtime.start(fake)
    # slots.total = "auto" asks the server for its slots at start: a real request too.
    auto = config.replace(slots=SlotsConfig(total="auto"))
    with pytest.raises(RealModelForbidden):
        Runtime.start(auto, model=ScriptedModel([]))
    # A profile with an endpoint of its own is a real model too, the main one a fake or not.
    with ChatServer([reply("fake")]) as server:
        profiled = config.replace(
            model=ModelConfig(base_url=server.base_url),
            agents={"researcher": AgentConfig(base_url="http://10.9.9.8:8080/v1")},
        )
        with pytest.raises(RealModelForbidden, match=r"10\.9\.9\.8:8080/v1"):
            Runtime.start(profiled).stop()  # stopped if it ever starts: the test fails, not hangs


def test_the_pytest_option_turns_the_switch_on(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_real="""
        from actors import Config, ModelConfig, Runtime

        def test_talks_to_a_real_model(tmp_path):
            Runtime.start(Config(home=str(tmp_path))).stop()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--loopd-no-real-model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RealModelForbidden*real models are forbidden*"])


def test_the_loopd_runtime_fixture_takes_runtime_starts_names(loopd_runtime) -> None:
    from datetime import UTC, datetime

    fixed = datetime(2026, 11, 29, 23, 59, 1, tzinfo=UTC)
    model = ScriptedModel([call("clock"), reply("late")])
    rt = loopd_runtime(model=model, clock=lambda: fixed)
    assert rt.run_turn("s", "time?", timeout=10) == TurnCompleted("s", "late")
    assert model.requests[1].messages[-1].content == "2026-11-29T23:59:01Z"
    model.assert_complete()


class Standalone:
    """``python -m actors.testing.chat_server`` in a subprocess, run with ``-W error`` so that
    any warning at start (runpy's among them) ends it; stopped by SIGTERM at the end."""

    def __init__(self, script: Path, *flags: str) -> None:
        command = [sys.executable, "-W", "error", "-m", "actors.testing.chat_server"]
        self.process = subprocess.Popen(
            [*command, "--script", str(script), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert self.process.stdout is not None
        self.first = self.process.stdout.readline()
        self.out = self.err = ""

    @property
    def base_url(self) -> str:
        assert self.first.startswith("serving http://127.0.0.1:"), self.first
        return self.first.split()[1]

    def stop(self) -> int:
        """SIGTERM, then what it printed after its first line; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.out, self.err = self.process.communicate(timeout=10)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        return self.process.returncode


def standalone_runtime(tmp_path: Path, server: Standalone) -> Runtime:
    config = Config(home=str(tmp_path / "home"), model=ModelConfig(base_url=server.base_url))
    return Runtime.start(config)


def test_the_chat_server_runs_on_its_own_from_a_script_file(tmp_path) -> None:
    script = tmp_path / "answers.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "clock", "arguments": {}}]}, "It is late.", "unused"])
    )
    server = Standalone(script)
    try:
        assert "(3 answers)" in server.first
        with standalone_runtime(tmp_path, server) as rt:
            assert rt.run_turn("s", "what time?", timeout=10) == TurnCompleted(
                "s", "It is late.", usage=Usage(requests=2, unmeasured_requests=2)
            )
    finally:
        assert server.stop() == 0, server.err
    assert server.out.strip() == "stopped after 2 request(s)"
    assert server.err == ""  # no warning (runpy's) nor error


def test_the_standalone_server_starts_without_a_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "actors.testing.chat_server", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert "--log FILE" in done.stdout


def test_a_bad_script_file_is_refused_with_its_place(tmp_path) -> None:
    script = tmp_path / "bad.json"
    script.write_text('["fine", {"tool_calls": [{"nme": "clock"}]}]')
    done = subprocess.run(
        [sys.executable, "-m", "actors.testing.chat_server", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 2
    assert "is not valid" in done.stderr and "nme" in done.stderr


OPENAI_CALLS = {
    # An assistant message as OpenAI sends it, copied into a script.
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "subagent", "arguments": json.dumps({"task": task})},
        }
        for task in ("weather in Oslo", "weather in Rome")
    ],
    "usage": {
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "total_tokens": 110,
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens_details": {"reasoning_tokens": 0},
    },
}
KEYED = {
    "conversations": [
        {
            "first_user_contains": "weather in Oslo",
            "answers": [
                {
                    "role": "assistant",
                    "content": "Snow, -3 C.",
                    "usage": {"prompt_tokens": 7, "completion_tokens": 2},
                }
            ],
        },
        {"first_user_contains": "weather in Rome", "answers": ["Sun, 21 C."]},
    ],
    "answers": [OPENAI_CALLS, "Oslo is cold, Rome is warm."],
}


def test_a_script_file_answers_each_child_by_its_task_and_logs_each_request(tmp_path) -> None:
    script, log = tmp_path / "keyed.json", tmp_path / "requests.jsonl"
    script.write_text(json.dumps(KEYED))
    server = Standalone(script, "--log", str(log))
    try:
        assert "(4 answers, 2 conversations)" in server.first
        with standalone_runtime(tmp_path, server) as rt:
            # The two children run at once: which asks first is anyone's guess.
            outcome = rt.run_turn("w", "what is the weather?", timeout=10)
    finally:
        assert server.stop() == 0, server.err
    assert isinstance(outcome, TurnCompleted)
    assert outcome.content == "Oslo is cold, Rome is warm."
    used = outcome.usage  # the parent's first answer and the Oslo child's
    assert (used.prompt_tokens, used.completion_tokens, used.cached_tokens) == (107, 12, 40)
    assert (server.out.strip(), server.err) == ("stopped after 4 request(s)", "")

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    chats = [line for line in lines if line["path"] == "/v1/chat/completions"]
    assert len(chats) == 4 and sorted(line["n"] for line in chats) == [1, 2, 3, 4]
    assert all(line["method"] == "POST" and isinstance(line["at"], float) for line in chats)
    last = next(line["body"] for line in chats if line["n"] == 4)
    assert first_user_text(last) == "what is the weather?"
    results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert results == ["sub-w-1 completed\nSnow, -3 C.", "sub-w-2 completed\nSun, 21 C."]


def ask(server: ChatServer, first_user: str) -> httpx.Response:
    body = {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": first_user}]
    }
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5)


def test_a_conversations_answers_go_in_order_and_then_run_out(tmp_path) -> None:
    script = tmp_path / "keyed.json"
    script.write_text(json.dumps(KEYED))
    with ChatServer(load_script(script)) as server:
        oslo = ask(server, "It is noon.\n\nweather in Oslo").json()
        assert oslo["choices"][0]["message"]["content"] == "Snow, -3 C."
        assert oslo["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        again = ask(server, "weather in Oslo, again")
        assert again.status_code == 500 and "ran out of answers after 1" in again.text
        first = ask(server, "anything else").json()  # no conversation: the answers in order
        assert first["choices"][0]["message"]["tool_calls"][1]["function"] == {
            "name": "subagent",
            "arguments": json.dumps({"task": "weather in Rome"}),
        }
        assert first["usage"]["total_tokens"] == 110
        rome = ask(server, "weather in Rome").json()
        assert rome["choices"][0]["message"]["content"] == "Sun, 21 C."
    (error,) = server.errors
    assert error == (
        "request 2 has no answer: the script of 'weather in Oslo' ran out of answers after 1"
    )


def test_the_guides_script_files_load(tmp_path) -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    section = guide.split("### Script files for the standalone server")[1].split("\n## ")[0]
    plain, keyed = re.findall(r"^```json\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    for name, text in (("plain", plain), ("keyed", keyed)):
        (tmp_path / name).write_text(text)
    assert load_script(tmp_path / "plain").describe() == "2 answers"
    script = load_script(tmp_path / "keyed")
    assert script.describe() == "4 answers, 2 conversations"
    child = {"messages": [{"role": "user", "content": "It is noon.\n\nweather in Rome"}]}
    assert script(child) == reply("Sun, 21 C.")


def test_the_first_user_text_of_a_body_with_parts_or_none() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert first_user_text({"messages": [{"role": "user", "content": parts}]}) == "a\nb"
    assert first_user_text({"messages": [{"role": "system", "content": "x"}]}) == ""
    assert first_user_text({"messages": "nonsense"}) == ""


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"role": "user", "content": "hi"}, "role"),
        (
            {"tool_calls": [{"name": "a", "function": {"name": "a"}}]},
            "not both - at `$[0].tool_calls[0]`",
        ),
        ({"tool_calls": [{"function": {"name": "a"}, "arguments": {}}]}, "inside its `function`"),
        ({"content": "x", "usage": {"prompt_tokens": -1, "completion_tokens": 0}}, ">= 0"),
        ({"content": "x", "usage": {"completion_tokens": 0}}, "prompt_tokens"),
    ],
)
def test_a_script_file_answer_is_refused_with_its_place(tmp_path, item, says) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps([item]))
    with pytest.raises(ValueError, match="is not valid") as refused:
        load_script(script)
    assert says in str(refused.value)


def test_a_conversation_key_must_not_be_empty_nor_given_twice(tmp_path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps({"conversations": [{"first_user_contains": "", "answers": []}]}))
    with pytest.raises(ValueError, match=r"at `\$.conversations\[0\].first_user_contains`"):
        load_script(script)
    twice = [{"first_user_contains": "a", "answers": []}] * 2
    script.write_text(json.dumps({"conversations": twice}))
    with pytest.raises(
        ValueError, match=r"'a' is the text of an earlier .* `\$.conversations\[1\]`"
    ):
        load_script(script)


def test_the_answers_in_order_say_so_when_they_run_out() -> None:
    script = FileScript([reply("only")], [("Oslo", [])])
    body = {"messages": [{"role": "user", "content": "what now?"}]}
    assert script(body) == reply("only")
    with pytest.raises(LookupError, match=r"answers in order ran out after 1 .*'what now\?'"):
        script(body)


def test_the_log_has_a_line_for_each_request_as_it_arrives(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text("from an earlier run\n")
    release = threading.Event()

    def held(body: dict[str, Any]) -> Any:
        release.wait(10)
        return reply("late")

    with ChatServer(held, total_slots=2, log=log) as server:
        url = server.base_url.removesuffix("/v1")
        assert httpx.get(f"{url}/props", timeout=5).status_code == 200
        assert httpx.post(f"{url}/nowhere", content=b"x", timeout=5).status_code == 404
        bad = httpx.post(f"{server.base_url}/chat/completions", content=b"[1]", timeout=5)
        assert bad.status_code == 400
        answer: list[httpx.Response] = []
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        sender = threading.Thread(
            target=lambda: answer.append(
                httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=10)
            )
        )
        sender.start()
        server.wait_for_requests(1)
        lines = [json.loads(line) for line in log.read_text().splitlines()]  # still held
        release.set()
        sender.join(10)
    assert answer[0].status_code == 200
    assert [(line.get("n"), line["method"], line["path"]) for line in lines] == [
        (None, "GET", "/props"),
        (None, "POST", "/nowhere"),
        (None, "POST", "/v1/chat/completions"),
        (1, "POST", "/v1/chat/completions"),
    ]
    assert lines[2]["raw"] == "[1]" and lines[3]["body"] == body
    assert "headers" not in lines[3]  # they may carry an API key


def test_watch_sees_a_session_actor_stop(loopd_runtime) -> None:
    from actors.dispatcher.directory import session_address

    rt = loopd_runtime([reply("hi")])
    assert rt.run_turn("s", "hello", timeout=10) == TurnCompleted("s", "hi")
    session = rt.directory.get(session_address("s"))
    watcher = Probe.start()
    try:
        watcher.watch(session)
        watcher.expect_none(within=0.1)
        rt.stop()
        assert watcher.expect(Terminated(session)).ref is session
    finally:
        watcher.stop()


def test_a_wait_of_the_server_that_runs_out_says_what_it_saw() -> None:
    with ChatServer([]) as server:
        with pytest.raises(AssertionError, match=r"expected 1 request\(s\) within 0\.05 s, but 0"):
            server.wait_for_requests(1, timeout=0.05)
        with pytest.raises(AssertionError, match=r"expected 2 connection\(s\) closed .* but 0"):
            server.wait_for_closed(2, timeout=0.05)
        server.wait_for_idle(timeout=0.05)
