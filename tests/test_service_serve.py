"""``loopd serve --listen``: the service in a real daemon process, stopped by a real SIGTERM
while turns and an event stream are in flight."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec

from actors.testing import ChatServer, reply
from actors.testing.chat_server import Delayed
from messages import FailReason, TurnFailed, TurnOutcome

TIMEOUT_S = 30.0
TOKEN = "serve-test-token-31c9"


class Lines:
    """The lines of a child's pipe, read by a thread, waited for with a deadline."""

    def __init__(self, stream) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line)

    def rest(self) -> str:
        """Every line seen, and those still queued (the pipe has closed)."""
        while not self.queue.empty():
            self.seen.append(self.queue.get())
        return "".join(self.seen)

    def until(self, text: str) -> str:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen.append(line)
            if text in line:
                return line


def test_sigterm_answers_every_request_in_flight_then_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The model answers only after the test is over: both turns are cut off by the stop.
    with ChatServer(lambda body: Delayed(reply("late"), 60)) as server:
        config = tmp_path / "loopd.toml"
        config.write_text(
            f'home = "{home}"\n[model]\nbase_url = "{server.base_url}"\n'
            '[serve]\nlisten = "127.0.0.1:9"\ntoken_env = "LOOPD_TEST_TOKEN"\n'
        )
        args = ["serve", "--config", str(config), "--listen", "127.0.0.1:0"]
        daemon = subprocess.Popen(
            [sys.executable, "-m", "actors.shells.cli", *args],
            cwd=tmp_path,
            env=dict(os.environ, HOME=str(tmp_path), LOOPD_TEST_TOKEN=TOKEN),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            err = Lines(daemon.stderr)
            url = err.until("loopd serve: listening on ").rsplit(" ", 1)[1].strip()
            assert not url.endswith(":9")  # --listen wins over [serve] listen
            assert httpx.get(url + "/v1/sessions").status_code == 401  # the token is needed
            auth = {"Authorization": f"Bearer {TOKEN}"}
            client = httpx.Client(base_url=url, timeout=TIMEOUT_S, headers=auth)
            started: set[str] = set()
            both_started = threading.Event()
            stream_ended = threading.Event()
            attached = threading.Event()

            def watch() -> None:
                with client.stream("GET", "/v1/events") as response:
                    attached.set()  # its head came: the service feeds it from now on
                    for line in response.iter_lines():
                        if line.startswith("data: ") and '"type":"TurnStarted"' in line:
                            started.add(msgspec.json.decode(line[6:])["session"])
                            if started == {"a", "b"}:
                                both_started.set()
                stream_ended.set()  # the stream ended as a stream does, not cut off

            answers: dict[str, httpx.Response] = {}

            def turn(session: str) -> None:
                answers[session] = client.post(f"/v1/sessions/{session}/turns", json={"text": "hi"})

            threads = [threading.Thread(target=watch, daemon=True)]
            threads += [threading.Thread(target=turn, args=(s,), daemon=True) for s in "ab"]
            threads[0].start()
            assert attached.wait(TIMEOUT_S)
            for t in threads[1:]:
                t.start()
            assert both_started.wait(TIMEOUT_S)
            server.wait_for_requests(1, TIMEOUT_S)
            daemon.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(TIMEOUT_S)
            daemon.wait(TIMEOUT_S)
            err.until("loopd serve: stopped")
            rest = err.rest()
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait(TIMEOUT_S)
    assert daemon.returncode == 0, rest
    assert "Traceback" not in rest and "ERROR" not in rest and "ASGI" not in rest
    assert TOKEN not in rest  # never in what the process says
    assert stream_ended.is_set()
    for session in "ab":
        assert answers[session].status_code == 200
        outcome = msgspec.json.decode(answers[session].content, type=TurnOutcome)
        assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.CANCELLED
