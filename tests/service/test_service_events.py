"""The service's event stream: ids and tags, one family, Last-Event-ID replay and its gaps, and
clients too slow to keep up (dropped, or cut off), with real actors and a real uvicorn."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import msgspec
from service_kit import WAIT, Reader, ended

from actors.shells.demo import DEMO_SESSION, DEMO_TEXT, demo_script
from actors.shells.service.events import EventHub
from actors.testing import reply
from messages import McpServerUp, TextDelta, TurnEnded, TurnEvent


def test_events_stream_every_event_of_the_family_with_increasing_ids_and_tags(serve) -> None:
    s = serve()
    reader = Reader(s.client, ended(DEMO_SESSION))
    assert reader.status == 200 and reader.content_type.startswith("text/event-stream")
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = reader.wait()
    ids = [int(f["id"]) for f in got]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # increasing, none skipped
    events = [msgspec.json.decode(f["data"], type=TurnEvent) for f in got]
    assert [f["event"] for f in got] == [type(e).__name__ for e in events]
    sessions = {e.session for e in events}
    assert sessions == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}  # children's included
    assert {"SubagentStarted", "SubagentFinished", "ToolCallStarted"} <= {f["event"] for f in got}


def test_events_of_one_session_are_its_familys_only(serve) -> None:
    s = serve()
    family = Reader(s.client, ended(DEMO_SESSION), query=f"?session={DEMO_SESSION}")
    s.client.post("/v1/sessions/other/turns", json={"text": DEMO_TEXT})
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = [msgspec.json.decode(f["data"], type=TurnEvent) for f in family.wait()]
    assert {e.session for e in got} == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert s.client.get("/v1/events?session=bad%20id").status_code == 400


def test_last_event_id_replays_the_buffered_events_after_it(serve) -> None:
    s = serve()
    first = Reader(s.client, ended(DEMO_SESSION))
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    seen = first.wait()
    middle = seen[len(seen) // 2]["id"]
    again = Reader(
        s.client, lambda f: f.get("id") == seen[-1]["id"], headers={"Last-Event-ID": middle}
    )
    replayed = again.wait()
    assert replayed == [f for f in seen if int(f["id"]) > int(middle)]
    bad = s.client.get("/v1/events", headers={"Last-Event-ID": "nine"})
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["error"]


def test_a_replay_that_reaches_past_the_buffer_says_gap_first(serve) -> None:
    s = serve(replay_events=5)
    first = Reader(s.client, ended(DEMO_SESSION))
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    seen = first.wait()
    again = Reader(
        s.client, lambda f: f.get("id") == seen[-1]["id"], headers={"Last-Event-ID": "0"}
    )
    replayed = again.wait()
    assert replayed[0]["event"] == "gap" and "id" not in replayed[0]
    gap = msgspec.json.decode(replayed[0]["data"])
    assert gap["after"] == 0 and gap["first"] == int(seen[-5]["id"])
    assert replayed[1:] == seen[-5:]


def test_a_last_event_id_of_an_earlier_run_says_gap_and_streams_on(serve) -> None:
    s = serve()
    again = Reader(s.client, ended(DEMO_SESSION), headers={"Last-Event-ID": "5000"})
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    got = again.wait()
    gap = msgspec.json.decode(got[0]["data"])
    assert got[0]["event"] == "gap" and gap["after"] == 5000 and gap["first"] == 1
    assert "restarted" in gap["detail"]
    assert got[1]["id"] == "1" and got[1]["event"] == "TurnStarted"


def test_a_slow_client_is_told_and_dropped_and_turns_do_not_wait_for_it(serve) -> None:
    """A client that never reads: its queue fills, it gets a ``dropped`` event and its stream
    ends, while turns with large answers go on and a reading client sees every event."""
    big = "x" * 200_000
    s = serve(lambda request: reply(big), client_queue=8)
    host, port = "127.0.0.1", s.service.port
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(WAIT)
    slow.connect((host, port))
    slow.sendall(f"GET /v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:  # the answer's head: the client is attached
        head += slow.recv(1)
    assert head.startswith(b"HTTP/1.1 200")
    fast = Reader(s.client, ended("last"))
    hub = s.service.state.hub
    assert hub.clients == 2
    started = time.monotonic()
    for n in range(400):  # until the socket's buffers and then the queue of 8 are full
        response = s.client.post(f"/v1/sessions/t{n}/turns", json={"text": "go"})
        assert response.status_code == 200
        if hub.clients == 1:  # the slow one was dropped, the fast one reads on
            break
    assert hub.clients == 1, "the slow client was never dropped"
    assert s.client.post("/v1/sessions/last/turns", json={"text": "go"}).status_code == 200
    took = time.monotonic() - started
    got = fast.wait()
    ids = [int(f["id"]) for f in got]
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # the reading client missed nothing
    assert took < WAIT
    received = bytearray()
    while not received.endswith(b"\r\n0\r\n\r\n"):  # to the end of its stream
        chunk = slow.recv(1 << 20)
        assert chunk, "the connection closed before the stream's end"
        received += chunk
    slow.close()
    tail = bytes(received[-2000:])
    assert b"event: dropped" in tail and b"fell more than 8 events behind" in tail


def test_a_stalled_client_is_cut_off_after_the_write_deadline(serve, monkeypatch) -> None:
    """A client that takes nothing while its queue still has room: a write that waits past
    WRITE_S ends its stream, so it holds up neither the runtime nor a stop."""
    from actors.shells.service import app

    monkeypatch.setattr(app, "WRITE_S", 0.3)
    big = "x" * 200_000
    s = serve(lambda request: reply(big), client_queue=100_000)
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(WAIT)
    stalled.connect(("127.0.0.1", s.service.port))
    stalled.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += stalled.recv(1)
    hub = s.service.state.hub
    assert hub.clients == 1
    n = 0
    deadline = time.monotonic() + WAIT
    while hub.clients:  # turns go on until the stalled stream is cut
        assert time.monotonic() < deadline, "the stalled client was never cut off"
        assert s.client.post(f"/v1/sessions/w{n}/turns", json={"text": "go"}).status_code == 200
        n += 1
    received = bytearray()
    while chunk := stalled.recv(1 << 20):  # what was buffered, then the end of the connection
        received += chunk
    stalled.close()
    assert not received.endswith(b"\r\n0\r\n\r\n") and b"event: dropped" not in received


def test_head_of_events_is_the_head_only(serve) -> None:
    s = serve()
    response = s.client.head("/v1/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert s.service.state.hub.clients == 0


def test_events_nobody_watched_are_replayed_from_the_start(serve) -> None:
    # Frames are encoded when a client first needs them: a turn nobody streamed is kept as
    # events and still replays whole, in order, from Last-Event-ID 0.
    s = serve()
    s.client.post(f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT})
    replayed = Reader(s.client, ended(DEMO_SESSION), headers={"Last-Event-ID": "0"}).wait()
    assert [int(f["id"]) for f in replayed] == list(range(1, len(replayed) + 1))
    events = [msgspec.json.decode(f["data"], type=TurnEvent) for f in replayed]
    assert [f["event"] for f in replayed] == [type(e).__name__ for e in events]
    assert {e.session for e in events} == {"demo", "sub-demo-1", "sub-sub-demo-1-1"}
    assert isinstance(events[-1], TurnEnded)


def test_a_burst_of_events_from_another_thread_keeps_its_order_and_numbers() -> None:
    # An actor thread queues events and wakes the loop only when no drain is pending: however
    # the two interleave, every turn event is published once, in order, numbered 1, 2, 3...,
    # and an event that names no session (an MCP server's) is skipped, not a stop.
    count = 2000

    async def run() -> list[int]:
        hub = EventHub(replay_events=count, client_queue=count)
        offers: list[Any] = []
        hub.attach(lambda offer: (offers.append(offer), lambda: None)[1])
        client = hub.open(None)
        bursts: list[Any] = [TextDelta(session=f"s{i % 7}", text=str(i)) for i in range(count)]
        bursts.insert(count // 2, McpServerUp(server="files"))  # no session: not streamed
        thread = threading.Thread(target=lambda: [offers[0](event) for event in bursts])
        thread.start()
        frames: list[bytes] = []
        async with asyncio.timeout(WAIT):
            while len(frames) < count:
                frames += await client.next_frames(WAIT) or []
        thread.join(WAIT)
        texts = [msgspec.json.decode(f.split(b"data: ")[1])["text"] for f in frames]
        assert texts == [str(i) for i in range(count)]
        return [int(f.split(b"\n")[0].removeprefix(b"id: ")) for f in frames]

    assert asyncio.run(run()) == list(range(1, count + 1))


def test_an_inline_subscriber_sees_what_the_bus_does_on_the_emitting_thread(
    loopd_runtime, caplog
) -> None:
    # The service's hub subscribes inline (no hop to the bus's thread): it must see the same
    # events in the same order as a bus subscriber, and one that raises fails no turn.
    rt = loopd_runtime(demo_script)
    inline: list[TurnEvent] = []
    threads: set[str] = set()
    bus: list[TurnEvent] = []
    done = threading.Event()

    def on_bus(event: TurnEvent) -> None:
        bus.append(event)
        if isinstance(event, TurnEnded) and event.session == DEMO_SESSION:
            done.set()

    def keep(event: TurnEvent) -> None:
        inline.append(event)
        threads.add(threading.current_thread().name)

    def broken(event: TurnEvent) -> None:
        raise RuntimeError("a broken subscriber")

    rt.subscribe(keep, inline=True)
    rt.subscribe(broken, inline=True)
    rt.subscribe(on_bus)
    outcome = rt.run_turn(DEMO_SESSION, DEMO_TEXT, timeout=WAIT)
    assert type(outcome).__name__ == "TurnCompleted"
    assert done.wait(WAIT)
    # Each session's events in its order (two sessions' threads may interleave differently).
    for session in {e.session for e in bus}:
        assert [e for e in inline if e.session == session] == [
            e for e in bus if e.session == session
        ]
    assert len(inline) == len(bus) and {e.session for e in inline} == {e.session for e in bus}
    assert not any(name.startswith("EventBus") for name in threads)
    assert "a broken subscriber" in caplog.text
