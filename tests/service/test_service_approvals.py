"""Approvals over the service: a real uvicorn on 127.0.0.1, a real httpx client, real actors on
the scripted model with a port tool that waits for a person. Listing, approving, declining,
refusals (400, 401, 409), two decisions at once, and the approval events in the SSE stream."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import msgspec
import pytest
from service_kit import WAIT, Reader, Served, ended, outcome

from actors import port_tool
from actors.testing import call, reply
from messages import (
    ApprovalRefused,
    ApprovalRequested,
    ApprovalSettled,
    ModelRequest,
    TurnCompleted,
    TurnEvent,
)


@port_tool(approval=True)
def deploy(env: str) -> str:
    """Deploy to an environment.

    Args:
        env: Where to.
    """
    return f"deployed to {env}"


def script(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if last.role == "user":
        return call("deploy", env="prod")
    return reply(f"tool said: {last.content}")


def waiting(s: Served, session: str) -> tuple[threading.Event, list[ApprovalRequested]]:
    """Set once ``session``'s call waits for a person (subscribed before its turn starts)."""
    seen = threading.Event()
    requests: list[ApprovalRequested] = []

    def see(event: TurnEvent) -> None:
        if isinstance(event, ApprovalRequested) and event.session == session:
            requests.append(event)
            seen.set()

    s.rt.subscribe(see)
    return seen, requests


def start_waiting(s: Served, session: str) -> ApprovalRequested:
    """Start a turn of ``session`` (not waited on) and return its call's request."""
    seen, requests = waiting(s, session)
    response = s.client.post(f"/v1/sessions/{session}/turns", json={"text": "ship", "wait": False})
    assert response.status_code == 202
    assert seen.wait(WAIT)
    return requests[0]


def test_a_waiting_call_is_listed_then_approved_and_its_turn_completes(serve) -> None:
    s = serve(script, tools=[deploy])
    assert s.client.get("/v1/approvals").json() == {"approvals": []}
    done = s.ended("ops")
    answers: list[httpx.Response] = []
    seen, requests = waiting(s, "ops")
    waiter = threading.Thread(
        target=lambda: answers.append(s.client.post("/v1/sessions/ops/turns", json={"text": "x"}))
    )
    waiter.start()
    assert seen.wait(WAIT)
    listed = s.client.get("/v1/approvals")
    assert listed.status_code == 200
    assert listed.content == msgspec.json.encode({"approvals": requests})  # the events' own JSON
    row = listed.json()["approvals"][0]
    assert (row["type"], row["session"], row["call_id"], row["tool"]) == (
        "ApprovalRequested",
        "ops",
        1,
        "deploy",
    )
    assert msgspec.json.decode(row["arguments"]) == {"env": "prod"} and row["untrusted"] is False

    response = s.client.post("/v1/approvals/ops/1", json={"approve": True, "note": "go"})
    assert response.status_code == 200, response.text
    settled = msgspec.json.decode(response.content, type=ApprovalSettled)
    assert (settled.session, settled.call_id, settled.approved) == ("ops", 1, True)
    assert response.json()["type"] == "ApprovalSettled"
    waiter.join(WAIT)
    assert done.wait(WAIT)
    finished = outcome(answers[0])
    assert isinstance(finished, TurnCompleted)
    assert finished.content == "tool said: deployed to prod"
    assert s.client.get("/v1/approvals").json() == {"approvals": []}

    again = s.client.post("/v1/approvals/ops/1", json={"approve": False, "reason": "late"})
    assert again.status_code == 409
    refused = msgspec.json.decode(again.content, type=ApprovalRefused)
    assert (refused.session, refused.call_id) == ("ops", 1) and refused.detail
    never = s.client.post("/v1/approvals/nobody/7", json={"approve": True})
    assert never.status_code == 409 and never.json()["type"] == "ApprovalRefused"


def test_a_declined_call_answers_the_model_with_the_reason(serve) -> None:
    s = serve(script, tools=[deploy])
    start_waiting(s, "ops")
    done = s.ended("ops")
    response = s.client.post("/v1/approvals/ops/1", json={"approve": False, "reason": "not today"})
    assert response.status_code == 200
    assert response.json() == {**response.json(), "approved": False, "call_id": 1}
    assert done.wait(WAIT)
    shown = s.client.get("/v1/sessions/ops").json()
    assert shown["transcript"][-1]["content"] == (
        "tool said: Denied: a person declined this call: not today."
    )


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/approvals/ops/1", [True], "must be a JSON object, not an array"),
        ("/v1/approvals/ops/1", None, "must be a JSON object, not null"),
        ("/v1/approvals/ops/1", {}, "missing required field `approve`"),
        ("/v1/approvals/ops/1", {"approve": "yes"}, "Expected `bool`, got `str` - at `$.approve`"),
        ("/v1/approvals/ops/1", {"approve": 1}, "at `$.approve`"),
        ("/v1/approvals/ops/1", {"approve": False}, 'a decline needs a "reason"'),
        ("/v1/approvals/ops/1", {"approve": False, "reason": "  "}, 'needs a "reason"'),
        ("/v1/approvals/ops/1", {"approve": True, "note": 3}, "at `$.note`"),
        ("/v1/approvals/ops/1", {"approve": True, "why": "x"}, "unknown field `why`"),
        ("/v1/approvals/a%20b/1", {"approve": True}, "invalid session id 'a b'"),
        ("/v1/approvals/-x/1", {"approve": True}, "invalid session id '-x'"),
        ("/v1/approvals/ops/0", {"approve": True}, "invalid call id '0'"),
        ("/v1/approvals/ops/-1", {"approve": True}, "invalid call id '-1'"),
        ("/v1/approvals/ops/one", {"approve": True}, "invalid call id 'one'"),
        ("/v1/approvals/ops/1.0", {"approve": True}, "invalid call id '1.0'"),
        ("/v1/approvals/ops/" + "9" * 30, {"approve": True}, "invalid call id"),
    ],
)
def test_a_bad_decision_is_400_naming_it_and_settles_nothing(
    serve, path: str, body: Any, said: str
) -> None:
    s = serve(script, tools=[deploy])
    start_waiting(s, "ops")
    response = s.client.post(path, content=msgspec.json.encode(body))
    assert response.status_code == 400, response.text
    assert said in response.json()["error"]
    assert [a["call_id"] for a in s.client.get("/v1/approvals").json()["approvals"]] == [1]


def test_a_body_that_is_not_json_is_400(serve) -> None:
    s = serve(script, tools=[deploy])
    for raw in (b"{", b"", b"\xff"):
        response = s.client.post("/v1/approvals/ops/1", content=raw)
        assert response.status_code == 400 and "error" in response.json()


def test_with_a_token_the_approvals_endpoints_need_it(serve) -> None:
    secret = "approvals-token-31c"
    s = serve(script, token=secret, tools=[deploy])
    start_waiting(s, "ops")
    with httpx.Client(base_url=s.service.url, timeout=WAIT) as bare:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert bare.get("/v1/approvals", headers=headers).status_code == 401
            response = bare.post("/v1/approvals/ops/1", headers=headers, json={"approve": True})
            assert response.status_code == 401 and secret not in response.text
    assert len(s.client.get("/v1/approvals").json()["approvals"]) == 1  # nothing was settled
    assert s.client.post("/v1/approvals/ops/1", json={"approve": True}).status_code == 200


def test_of_two_decisions_at_once_one_is_200_and_the_other_409(serve) -> None:
    s = serve(script, tools=[deploy])
    start_waiting(s, "ops")
    done = s.ended("ops")
    barrier = threading.Barrier(2)
    answers: dict[str, httpx.Response] = {}

    def decide(name: str, body: dict[str, Any]) -> None:
        with httpx.Client(base_url=s.service.url, timeout=WAIT) as client:
            barrier.wait(WAIT)
            answers[name] = client.post("/v1/approvals/ops/1", json=body)

    threads = [
        threading.Thread(target=decide, args=("yes", {"approve": True})),
        threading.Thread(target=decide, args=("no", {"approve": False, "reason": "mine"})),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(a.status_code for a in answers.values()) == [200, 409]
    won = next(name for name, a in answers.items() if a.status_code == 200)
    assert answers[won].json()["approved"] is (won == "yes")
    lost = next(a for a in answers.values() if a.status_code == 409)
    assert lost.json()["type"] == "ApprovalRefused"
    assert done.wait(WAIT)
    content = s.client.get("/v1/sessions/ops").json()["transcript"][-1]["content"]
    assert ("deployed to prod" in content) is (won == "yes")


def test_the_approval_events_flow_in_the_event_stream_of_the_family(serve) -> None:
    def family(request: ModelRequest) -> Any:
        if request.session == "boss" and request.messages[-1].role == "user":
            return call("subagent", task="ship it")
        if request.session == "boss":
            return reply("done")
        return script(request)

    s = serve(family, tools=[deploy])
    reader = Reader(s.client, ended("boss"), "?session=boss")
    seen, requests = waiting(s, "sub-boss-1")
    assert s.client.post("/v1/sessions/boss/turns", json={"text": "x", "wait": False}).is_success
    assert seen.wait(WAIT)  # the child's call waits: the request names the child
    listed = s.client.get("/v1/approvals").json()["approvals"]
    assert [(a["session"], a["call_id"]) for a in listed] == [("sub-boss-1", requests[0].call_id)]
    response = s.client.post(
        f"/v1/approvals/sub-boss-1/{requests[0].call_id}", json={"approve": True}
    )
    assert response.status_code == 200
    frames = reader.wait()
    kinds = [f["event"] for f in frames]
    assert "ApprovalRequested" in kinds and "ApprovalSettled" in kinds
    assert kinds.index("ApprovalRequested") < kinds.index("ApprovalSettled") < len(kinds) - 1
    asked = next(f for f in frames if f["event"] == "ApprovalRequested")
    assert msgspec.json.decode(asked["data"], type=ApprovalRequested) == requests[0]
    settled = msgspec.json.decode(
        next(f for f in frames if f["event"] == "ApprovalSettled")["data"], type=ApprovalSettled
    )
    assert (settled.session, settled.approved) == ("sub-boss-1", True)
    ids = [int(f["id"]) for f in frames]
    assert ids == sorted(ids)


def test_once_the_runtime_has_stopped_a_decision_or_a_listing_is_503(serve) -> None:
    s = serve(script, tools=[deploy])
    start_waiting(s, "ops")
    s.rt.stop()
    listed = s.client.get("/v1/approvals")
    assert listed.status_code == 503 and "stopping" in listed.json()["error"]
    response = s.client.post("/v1/approvals/ops/1", json={"approve": True})
    assert response.status_code == 503 and "stopped" in response.json()["error"]
