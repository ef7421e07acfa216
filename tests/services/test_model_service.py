"""The model service over real HTTP: cancel, time limits and stop close the connection; the
deadline and the answer cap hold whatever the server does; two requests never share a slot."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import pytest

from actors.core.config import Config, ConfigError, ModelConfig
from actors.dispatcher.directory import Directory
from actors.models.base import ModelFailure
from actors.models.http import HttpChatModel
from actors.models.wire import answer_too_large
from actors.runtime import Runtime
from actors.services.model_service import ModelService
from actors.shells.render import render_event
from actors.testing import ChatServer, Probe, ScriptedModel
from actors.testing.chat_server import Delayed, Drip, Endless
from actors.testing.script import RawResponse, call, calls, reply
from messages import (
    CancelModelRequest,
    ChatMessage,
    FailReason,
    ModelAnswer,
    ModelAnswered,
    ModelError,
    ModelRequest,
    TurnCompleted,
    TurnFailed,
    Usage,
)


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 10.0
LONG = 30.0
"""A server pause no test waits out: a test that ends sooner proves the client hung up."""


def on_http(config: Config, server: ChatServer, **model: Any) -> Config:
    """``config`` against ``server``, no retries, a short grace after a cut-off request."""
    values = {"base_url": server.base_url, "name": "m", "retries": 0, "disconnect_grace_s": 0.05}
    values.update(model)
    return config.replace(model=ModelConfig(**values))


def with_section(config: Config, section: str, **values: Any) -> Config:
    return config.replace(**{section: msgspec.structs.replace(getattr(config, section), **values)})


def is_child(body: dict[str, Any]) -> bool:
    first_user = next(m for m in body["messages"] if m["role"] == "user")
    return str(first_user["content"]).startswith("It is ")


def last(body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = body["messages"][-1]
    return message


def model_loops() -> list[threading.Thread]:
    """Model service loop threads (a sync model's pool threads of other tests may outlive
    their runtime while a script blocks; the loop never does)."""
    return [t for t in threading.enumerate() if t.name == "loopd-model"]


# --- the connection closes when nobody waits any more -----------------------------------------


def test_cancelling_a_turn_closes_its_connection(loopd_runtime, loopd_config, chat_server):
    answered = []

    def script(body: dict[str, Any]) -> Any:
        answered.append(body)
        return Delayed(reply("too late"), LONG) if len(answered) == 1 else reply("again")

    server = chat_server(script)
    rt = loopd_runtime(config=on_http(loopd_config, server))
    probe = Probe.start(rt.directory)
    rt.send_turn("s", "hi", reply_to=probe.address)
    server.wait_for_requests(1)
    cancelled_at = time.monotonic()
    assert rt.cancel("s") == ("s",)
    assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
    (closed,) = server.wait_for_closed(1, timeout=WAIT)
    assert (closed.number, closed.slot) == (1, 0)
    assert closed.at - cancelled_at < LONG  # the client hung up; the server did not finish
    # The session goes on, on the same slot, once the server has let go of it.
    assert rt.run_turn("s", "again", timeout=WAIT) == TurnCompleted(
        "s", "again", usage=unmeasured(1)
    )
    assert server.overlaps == []
    probe.stop()


def test_a_child_past_its_time_limit_has_its_connection_closed(
    loopd_runtime, loopd_config, chat_server
):
    def script(body: dict[str, Any]) -> Any:
        if is_child(body):
            return Delayed(reply("the child never gets here"), LONG)
        if last(body)["role"] == "user":
            return call("subagent", task="slow")
        return reply(last(body)["content"])

    server = chat_server(script)
    config = with_section(on_http(loopd_config, server), "loop", child_timeout_s=0.3)
    rt = loopd_runtime(config=config)
    assert rt.run_turn("p", "go", timeout=WAIT) == TurnCompleted(
        "p", "sub-p-1 failed", usage=unmeasured(2)
    )
    (closed,) = server.wait_for_closed(1, timeout=WAIT)
    assert closed.slot == 1  # the child's request, on the background slot
    assert server.requests[closed.number - 1]["id_slot"] == 1


def test_stop_closes_the_connection_and_leaves_no_model_thread(loopd_config, chat_server):
    server = chat_server(lambda body: Delayed(reply("never"), LONG))
    rt = Runtime.start(on_http(loopd_config, server))
    assert model_loops(), "the model service runs a thread of its own"
    probe = Probe.start(rt.directory)
    try:
        rt.send_turn("s", "hi", reply_to=probe.address)
        server.wait_for_requests(1)
        rt.stop()
        assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
    finally:
        rt.stop()
        probe.stop()
    server.wait_for_closed(1, timeout=WAIT)
    assert model_loops() == []
    assert rt.model_service.threads() == []  # an HTTP model has no thread pool


def test_stop_ends_a_wait_before_a_retry_at_once(loopd_config, chat_server):
    # The server is overloaded; the retry would come after 300 s (past the test's timeout).
    server = chat_server(lambda body: RawResponse(status=503, body=b"busy"))
    config = on_http(loopd_config, server, retries=3, retry_backoff_s=300, retry_max_wait_s=300)
    rt = Runtime.start(config)
    probe = Probe.start(rt.directory)
    try:
        rt.send_turn("s", "hi", reply_to=probe.address)
        server.wait_for_requests(1)
        server.wait_for_idle()
        rt.stop()
        assert probe.expect(TurnFailed, timeout=WAIT).reason is FailReason.CANCELLED
    finally:
        rt.stop()
        probe.stop()
    assert len(server.requests) == 1
    assert rt.model_service.threads() == []


# --- the deadline and the cap -----------------------------------------------------------------


@pytest.fixture
def http_model() -> Any:
    made: list[HttpChatModel] = []

    def build(server: ChatServer, **values: Any) -> HttpChatModel:
        model = HttpChatModel(ModelConfig(base_url=server.base_url, name="m", **values))
        made.append(model)
        return model

    yield build
    for model in made:
        model.close()


def request(slot: int = 0) -> ModelRequest:
    messages = (ChatMessage("system", "s"), ChatMessage("user", "hi"))
    return ModelRequest("s", 1, slot, messages, (), "s")


def test_a_server_that_drips_is_cut_off_at_the_deadline(chat_server, http_model):
    # Twenty bytes a second: the whole answer would take several seconds.
    server = chat_server([Drip(reply("x" * 200), interval_s=0.05)])
    model = http_model(server, timeout_s=0.4, retries=0)
    began = time.monotonic()
    with pytest.raises(ModelFailure) as caught:
        model.complete(request())
    took = time.monotonic() - began
    assert str(caught.value) == f"the model at {model.url} did not answer within 0.4 s"
    assert took < 5, f"the deadline did not hold: {took:.1f} s"
    server.wait_for_closed(1, timeout=WAIT)


def test_an_endless_answer_ends_with_the_cap_error(chat_server, http_model):
    server = chat_server([Endless()])
    model = http_model(server, max_answer_bytes=100_000, retries=2)
    with pytest.raises(ModelFailure) as caught:
        model.complete(request())
    assert str(caught.value) == answer_too_large(100_000)
    assert "model.max_answer_bytes (100000 bytes)" in str(caught.value)
    server.wait_for_closed(1, timeout=WAIT)
    assert len(server.requests) == 1  # a too-large answer is not retried


def test_a_declared_length_over_the_cap_is_refused_before_reading(chat_server, http_model):
    server = chat_server([RawResponse(body=b"x" * 5_000)])
    with pytest.raises(ModelFailure, match=r"larger than model.max_answer_bytes \(4096 bytes\)"):
        http_model(server, max_answer_bytes=4096).complete(request())


def test_an_answer_at_the_cap_is_read_whole(chat_server, http_model):
    server = chat_server([reply("ok")])
    size = len(b'{"id": "chatcmpl-1"}')  # any cap at least the body's size
    assert http_model(server, max_answer_bytes=10_000 + size).complete(request()).content == "ok"


def test_the_slot_wait_does_not_count_against_the_deadline(
    loopd_runtime, loopd_config, chat_server
):
    # One main slot, two sessions, each answer takes 0.3 s, the deadline is 0.5 s: the second
    # request waits about 0.3 s for the slot and still has its whole 0.5 s.
    server = chat_server(lambda body: Delayed(reply("ok"), 0.3))
    rt = loopd_runtime(config=on_http(loopd_config, server, timeout_s=0.5))
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    probe = Probe.start(rt.directory)
    rt.send_turn("a", "x", reply_to=probe.address)
    rt.send_turn("b", "x", reply_to=probe.address)
    assert [o.content for o in probe.expect_all(TurnCompleted, 2, timeout=WAIT)] == ["ok", "ok"]
    # Told once each answer is stored, through the bus: waited for, not read at once.
    waits = sorted(e.slot_wait_s for e in events.expect_all(ModelAnswered, 2, timeout=WAIT))
    assert waits[0] < 0.2 and waits[1] >= 0.2, waits
    assert server.overlaps == []
    probe.stop()
    events.stop()


def test_a_slot_rests_after_a_request_that_timed_out(loopd_runtime, loopd_config, chat_server):
    # a's request is cut off at its deadline while the server still works on it; b, waiting for
    # the same (only) slot, is sent only after disconnect_grace_s.
    def script(body: dict[str, Any]) -> Any:
        if last(body)["content"] == "slow":
            return Delayed(reply("too late"), LONG)
        return reply("quick")

    server = chat_server(script)
    config = on_http(loopd_config, server, timeout_s=0.3, disconnect_grace_s=0.5)
    rt = loopd_runtime(config=config)
    probe = Probe.start(rt.directory)
    rt.send_turn("a", "slow", reply_to=probe.address)
    server.wait_for_requests(1)
    rt.send_turn("b", "fast", reply_to=probe.address)
    failed = probe.expect(TurnFailed, timeout=WAIT)
    assert (
        failed.reason is FailReason.MODEL_ERROR and "did not answer within 0.3 s" in failed.detail
    )
    assert probe.expect(TurnCompleted, timeout=WAIT).content == "quick"
    (closed,) = server.closed
    arrived = server.arrivals[1]
    assert arrived - closed.at >= 0.5 - 0.05
    assert server.overlaps == []
    probe.stop()


# --- slots ------------------------------------------------------------------------------------


def test_concurrent_requests_never_share_a_slot(loopd_runtime, loopd_config, chat_server):
    server = chat_server(lambda body: Delayed(reply(f"on {body['id_slot']}"), 0.15))
    config = with_section(on_http(loopd_config, server), "slots", main=(0, 1))
    rt = loopd_runtime(config=config)
    events = Probe.start(rt.directory)
    rt.subscribe(events.tell)
    probe = Probe.start(rt.directory)
    for n in range(6):
        rt.send_turn(f"s{n}", "x", reply_to=probe.address)
    done = probe.expect_all(TurnCompleted, 6, timeout=WAIT)
    assert {d.content for d in done} <= {"on 0", "on 1"}
    assert server.overlaps == []
    assert server.most_in_flight == 2  # both slots worked at once
    answered = events.expect_all(ModelAnswered, 6, timeout=WAIT)
    assert {e.slot for e in answered} == {0, 1}
    assert max(e.slot_wait_s for e in answered) > 0.1  # some waited for a slot
    probe.stop()
    events.stop()


def test_a_session_asks_for_the_slot_that_caches_its_prompt(
    loopd_runtime, loopd_config, chat_server
):
    server = chat_server(lambda body: reply("ok"))
    config = with_section(on_http(loopd_config, server), "slots", main=(0, 1, 2))
    rt = loopd_runtime(config=config)
    for session in ("a", "b", "a", "c", "b"):
        assert rt.run_turn(session, "x", timeout=WAIT) == TurnCompleted(
            session, "ok", usage=unmeasured(1)
        )
    # a and b take the least recently used slots; back again, each gets its own slot, and c
    # takes the slot nobody has used.
    assert [body["id_slot"] for body in server.requests] == [0, 1, 0, 2, 1]


def test_children_of_one_answer_take_turns_on_the_slots_there_are(
    loopd_runtime, loopd_config, chat_server
):
    def script(body: dict[str, Any]) -> Any:
        if is_child(body):
            return Delayed(reply("child"), 0.2)
        if last(body)["role"] == "user":
            return calls(*[("subagent", {"task": f"t{n}"}) for n in range(4)])
        return reply("done")

    server = chat_server(script)
    server.total_slots = 4
    config = with_section(on_http(loopd_config, server), "slots", total="auto")
    rt = loopd_runtime(config=config)
    assert rt.config.slots.background == (1, 2, 3)
    assert rt.run_turn("p", "go", timeout=WAIT) == TurnCompleted("p", "done", usage=unmeasured(6))
    children = [b for b in server.requests if is_child(b)]
    assert len(children) == 4
    assert {b["id_slot"] for b in children} == {1, 2, 3}
    assert server.overlaps == []
    assert server.most_in_flight == 3  # three at once; the fourth waited for a free slot


def test_auto_slots_without_props_fail_the_start(loopd_config, chat_server):
    server = chat_server([])
    config = with_section(on_http(loopd_config, server), "slots", total="auto")
    with pytest.raises(ConfigError, match=r'slots.total = "auto": cannot read .* HTTP 404'):
        Runtime.start(config)


def test_auto_slots_refuse_a_pool_the_server_lacks(loopd_config, chat_server):
    server = ChatServer([], total_slots=2).start()
    try:
        config = with_section(on_http(loopd_config, server), "slots", total="auto", main=(0, 5))
        with pytest.raises(ConfigError, match=r"slots\.main names slot 5, but the server has 2"):
            Runtime.start(config)
    finally:
        server.stop()


def test_requests_in_flight_are_bounded_by_model_concurrency(loopd_runtime, loopd_config):
    release = threading.Event()
    lock = threading.Lock()
    running = 0
    most = 0

    def script(request: ModelRequest) -> Any:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(WAIT)
        with lock:
            running -= 1
        return reply("ok")

    model = ScriptedModel(script)
    config = with_section(loopd_config, "model", concurrency=2)
    rt = loopd_runtime(model=model, config=with_section(config, "loop", max_children=1))
    probe = Probe.start(rt.directory)
    for n in range(4):
        rt.send_turn(f"s{n}", "x", reply_to=probe.address)
    model.wait_for_requests(2)
    with pytest.raises(AssertionError, match="expected 3 model requests"):
        model.wait_for_requests(3, timeout=0.3)  # the other two wait for a permit
    release.set()
    assert len(probe.expect_all(TurnCompleted, 4, timeout=WAIT)) == 4
    assert most == 2
    probe.stop()


def test_the_concurrency_is_never_below_the_children_of_one_answer(loopd_runtime, loopd_config):
    # Three children that only answer once all three are in flight, with concurrency 1.
    together = threading.Barrier(3, timeout=WAIT)

    def script(request: ModelRequest) -> Any:
        if request.session.startswith("sub-"):
            together.wait()
            return reply("child")
        if request.messages[-1].role == "user":
            return calls(*[("subagent", {"task": f"t{n}"}) for n in range(3)])
        return reply("done")

    config = with_section(loopd_config, "model", concurrency=1)
    rt = loopd_runtime(script, config=with_section(config, "loop", max_children=3))
    assert rt.run_turn("p", "go", timeout=WAIT) == TurnCompleted("p", "done")


def test_the_event_line_names_the_slot_and_the_wait() -> None:
    answered = ModelAnswered(session="s", step=1, content="hi", slot=2, slot_wait_s=0.42)
    assert "← model answers (slot 2, waited 0.4 s for it): hi" in render_event(answered)
    calling = ModelAnswered(session="s", step=1, content=None, tools=("clock",), slot=0)
    assert render_event(calling).endswith("← model calls clock (slot 0)")
    unslotted = ModelAnswered(session="s", step=1, content="hi")
    assert render_event(unslotted).endswith("← model answers: hi")


# --- the service alone ------------------------------------------------------------------------


@pytest.fixture
def service_for(probe) -> Any:
    """Start model services on a fresh directory, each with a probe for its answers."""
    started: list[ModelService] = []

    def start(model: Any, **kwargs: Any) -> tuple[ModelService, Probe]:
        directory = Directory()
        service = ModelService(model, directory, concurrency=4, **kwargs).start()
        started.append(service)
        return service, probe(directory, "reply")

    yield start
    for service in started:
        service.stop()


def ask(n: int, to: Probe, pool: Any = "main") -> ModelRequest:
    messages = (ChatMessage("system", "s"), ChatMessage("user", f"request {n}"))
    return ModelRequest("s", n, 0, messages, (), to.address, pool=pool)


def test_a_request_the_service_cannot_place_is_answered_with_an_error(service_for):
    service, reply_probe = service_for(
        ScriptedModel([reply("x")], uses_slots=True), pools={"main": (0,)}
    )
    service.tell(ask(1, reply_probe, pool="background"))
    error = reply_probe.expect(ModelError, timeout=WAIT)
    assert error.request_id == 1
    assert error.detail.startswith("the model client failed: KeyError")


def test_a_sync_model_keeps_its_slot_until_the_call_returns(service_for):
    # A thread cannot be interrupted: a cancelled call still runs on its slot, so the next
    # request on that slot waits for it to return; a cancelled waiter is never answered.
    release = threading.Event()

    def script(request: ModelRequest) -> Any:
        if request.request_id == 1:
            release.wait(WAIT)
        return reply(f"answer {request.request_id}")

    model = ScriptedModel(script, uses_slots=True)
    service, reply_probe = service_for(model, pools={"main": (0,)})
    service.tell(ask(1, reply_probe))
    model.wait_for_requests(1)
    service.tell(ask(2, reply_probe))
    service.tell(CancelModelRequest("s", 1))  # running: its thread goes on
    service.tell(CancelModelRequest("s", 2))  # waiting: it leaves the queue
    service.tell(ask(3, reply_probe))
    with pytest.raises(AssertionError):
        model.wait_for_requests(2, timeout=0.3)  # slot 0 is still busy with request 1
    release.set()
    third = reply_probe.expect(ModelAnswer, timeout=WAIT)
    assert (third.request_id, third.slot) == (3, 0)
    assert [r.request_id for r in model.requests] == [1, 3]
    reply_probe.expect_none(within=0.2)  # neither cancelled request is answered


def test_a_model_that_never_blocks_is_answered_on_the_loop_without_threads(service_for):
    # blocking=False: the scripted answer runs on the service's loop, as the HTTP client's
    # coroutine does, so the service starts no thread of its pool; answers and slots as usual.
    model = ScriptedModel(
        lambda r: reply(f"answer {r.request_id}"), uses_slots=True, blocking=False
    )
    service, reply_probe = service_for(model, pools={"main": (0, 1)})
    for n in (1, 2, 3):
        service.tell(ask(n, reply_probe))
    answers = sorted(
        (reply_probe.expect(ModelAnswer, timeout=WAIT) for _ in range(3)),
        key=lambda a: a.request_id,
    )
    assert [(a.request_id, a.content) for a in answers] == [
        (1, "answer 1"),
        (2, "answer 2"),
        (3, "answer 3"),
    ]
    assert all(a.slot in (0, 1) for a in answers)
    assert [t.name for t in service.threads()] == ["loopd-model"]


def test_a_model_that_never_blocks_still_answers_its_failures(service_for):
    def script(request: ModelRequest) -> Any:
        raise ModelFailure("the script says no")

    service, reply_probe = service_for(ScriptedModel(script, blocking=False))
    service.tell(ask(1, reply_probe))
    assert reply_probe.expect(ModelError, timeout=WAIT).detail == "the script says no"


@pytest.mark.timeout(10)
def test_shutdown_joins_the_idle_pool_threads_and_leaves_a_blocked_call_running() -> None:
    """A stopped runtime leaves no idle model thread behind; a call that blocks is not waited
    for (it cannot be interrupted) and its thread ends when the call returns."""
    from actors.services.model_service import DaemonExecutor

    pool = DaemonExecutor(4, name="test-pool")
    release = threading.Event()
    runner: list[threading.Thread] = []

    def block() -> bool:
        runner.append(threading.current_thread())
        return release.wait(5)

    blocked = pool.submit(block)
    quick = [pool.submit(lambda i=i: i) for i in range(8)]
    assert [f.result(timeout=5) for f in quick] == list(range(8))
    assert runner, "the blocked call is running"
    started = pool.threads()
    assert len(started) >= 2  # the blocked call's thread and at least one more

    pool.shutdown(wait=True)

    assert pool.threads() == runner  # every idle thread has ended; the blocked one runs on
    assert not blocked.done()
    release.set()
    assert blocked.result(timeout=5) is True
    runner[0].join(timeout=5)
    assert pool.threads() == []
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
