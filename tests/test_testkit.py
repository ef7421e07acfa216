"""The test kit itself: the probe, the scripted model and the fake server behave as documented,
and fail with messages that say what happened."""

from __future__ import annotations

import threading

import httpx
import pytest

from actors import Directory, ModelFailure
from actors.testing import ChatServer, Probe, RawResponse, ScriptedModel, call, calls, reply
from messages import ModelRequest, ProposedCall, TurnCompleted, TurnFailed


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


def test_expect_refuses_what_is_neither_type_nor_predicate() -> None:
    probe = Probe.start()
    try:
        with pytest.raises(TypeError, match="a type or a predicate"):
            probe.expect(42)
    finally:
        probe.stop()


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


STUCK_ACTOR = """
import threading

import pykka

release = threading.Event()


class Stuck(pykka.ThreadingActor):
    def on_receive(self, message):
        release.wait(30)  # busy past the kit's deadline; let go at interpreter exit


def test_leaves_a_busy_actor(request):
    ref = Stuck.start()
    ref.tell("work")
    request.config.add_cleanup(release.set)  # after the plugin's sessionfinish
"""


def test_a_run_whose_tests_leave_work_in_flight_exits_0_and_warns(
    pytester: pytest.Pytester,
) -> None:
    # One run, two tests: one leaves a model request on a server that never answers, the other
    # an actor busy past the kit's deadline. Both pass, and so does the run.
    pytester.makepyfile(test_in_flight=IN_FLIGHT, test_stuck=STUCK_ACTOR)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "loopd_stop_timeout=0.5", timeout=60
    )
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes()["passed"] == 2
    result.stdout.fnmatch_lines(
        ["*LoopdCleanupWarning: loopd's test kit could not stop * actor(s) within 0.5 s*Stuck*"]
    )
    assert "Timeout" not in result.stdout.str() + result.stderr.str()
