"""The test kit itself: the probe, the scripted model and the fake server behave as documented,
and fail with messages that say what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from actors import Config, Directory, ModelConfig, ModelFailure, Runtime, SlotsConfig
from actors.core.config import AgentConfig
from actors.models.offline import ENV_VAR, RealModelForbidden
from actors.testing import ChatServer, Probe, RawResponse, ScriptedModel, call, calls, reply
from actors.testing.probe import Terminated
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


def test_the_chat_server_runs_on_its_own_from_a_script_file(tmp_path) -> None:
    script = tmp_path / "answers.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"name": "clock", "arguments": {}}]}, "It is late.", "unused"])
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "actors.testing.chat_server", "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        first = server.stdout.readline()
        assert first.startswith("serving http://127.0.0.1:") and "(3 answers)" in first
        base_url = first.split()[1]
        config = Config(home=str(tmp_path / "home"), model=ModelConfig(base_url=base_url))
        with Runtime.start(config) as rt:
            assert rt.run_turn("s", "what time?", timeout=10) == TurnCompleted(
                "s", "It is late.", usage=Usage(requests=2, unmeasured_requests=2)
            )
        server.send_signal(signal.SIGTERM)
        out, _err = server.communicate(timeout=10)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0
    assert out.strip() == "stopped after 2 request(s)"


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
