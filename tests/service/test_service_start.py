"""Starting and stopping the service: the refusals at start (an open address without a token,
an unset token, a taken port), and ``loopd serve --listen`` as a real daemon process stopped by a
real SIGTERM while turns and an event stream are in flight."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import httpx
import msgspec
import pytest
from serve_process import ServeProcess

from actors import Config
from actors.core.config import ConfigError, ServeConfig
from actors.shells.cli import main
from actors.shells.serve import STOP_SIGNALS
from actors.shells.service.settings import service_settings
from actors.testing import ChatServer, reply
from actors.testing.chat_server import Delayed
from messages import FailReason, TurnFailed, TurnOutcome

TIMEOUT_S = 30.0
TOKEN = "serve-test-token-31c9"


def test_sigterm_answers_every_request_in_flight_then_exits_0(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The model answers only after the test is over: both turns are cut off by the stop.
    with ChatServer(lambda body: Delayed(reply("late"), 60)) as server:
        config = (
            f'home = "{home}"\n[model]\nbase_url = "{server.base_url}"\n'
            '[serve]\nlisten = "127.0.0.1:9"\ntoken_env = "LOOPD_TEST_TOKEN"\n'
        )
        daemon = ServeProcess(tmp_path, config, {"LOOPD_TEST_TOKEN": TOKEN}, TIMEOUT_S)
        try:
            url = daemon.url
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
            daemon.proc.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(TIMEOUT_S)
            daemon.proc.wait(TIMEOUT_S)
            daemon.until("loopd serve: stopped")
            rest = daemon.rest()
        finally:
            daemon.kill()
    assert daemon.proc.returncode == 0, rest
    assert "Traceback" not in rest and "ERROR" not in rest and "ASGI" not in rest
    assert TOKEN not in rest  # never in what the process says
    assert stream_ended.is_set()
    for session in "ab":
        assert answers[session].status_code == 200
        outcome = msgspec.json.decode(answers[session].content, type=TurnOutcome)
        assert isinstance(outcome, TurnFailed) and outcome.reason is FailReason.CANCELLED


def test_a_non_loopback_address_without_a_token_and_an_unset_token_are_refused(
    tmp_path: Path,
) -> None:
    config = Config(home=str(tmp_path / "home"))
    with pytest.raises(ConfigError, match=r"refusing to serve on 0\.0\.0\.0:8321 without a token"):
        service_settings(config, "0.0.0.0:8321", environ={})
    with pytest.raises(ConfigError, match="not a loopback"):
        service_settings(config, "example.org:80", environ={})
    with_token = config.replace(serve=ServeConfig(token_env="LOOPD_TEST_TOKEN"))
    with pytest.raises(ConfigError, match="names LOOPD_TEST_TOKEN, which is unset or empty"):
        service_settings(with_token, "127.0.0.1:0", environ={"LOOPD_TEST_TOKEN": ""})
    settings = service_settings(with_token, "0.0.0.0:0", environ={"LOOPD_TEST_TOKEN": "tok-9f3"})
    assert settings is not None and settings.token == "tok-9f3" and "tok-9f3" not in repr(settings)
    assert service_settings(config, "[::1]:0", environ={}) is not None
    assert service_settings(config, None, environ={}) is None  # no address: no service
    flag_wins = config.replace(serve=ServeConfig(listen="0.0.0.0:1"))
    assert service_settings(flag_wins, "127.0.0.1:2", environ={}).port == 2


def test_loopd_serve_refuses_an_open_address_without_a_token_before_it_starts(
    tmp_path: Path, capsys
) -> None:
    home = tmp_path / "home"
    code = main(["serve", "--home", str(home), "--listen", "0.0.0.0:8321"])
    assert code == 2
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0:8321 without a token" in err
    assert "docs/runbook.md#serve-open-address" in err
    assert not home.exists()  # refused before anything was made
    assert main(["serve", "--home", str(home), "--listen", "nohost"]) == 2
    assert "--listen must be HOST:PORT" in capsys.readouterr().err


def test_loopd_serve_refuses_a_token_env_that_is_unset_or_empty(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    home = tmp_path / "home"
    config = tmp_path / "loopd.toml"
    config.write_text(f'home = "{home}"\n[serve]\nlisten = "127.0.0.1:0"\ntoken_env = "LOOPD_T"\n')
    for value in (None, ""):
        if value is None:
            monkeypatch.delenv("LOOPD_T", raising=False)
        else:
            monkeypatch.setenv("LOOPD_T", value)
        assert main(["serve", "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert "serve.token_env names LOOPD_T, which is unset or empty" in err
        assert "docs/runbook.md#serve-token-unset" in err
        assert not home.exists()


def test_loopd_serve_on_a_taken_port_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        code = main(["serve", "--home", str(tmp_path / "home"), "--listen", f"127.0.0.1:{port}"])
    assert code == 2
    # A failed start leaves the process's signal handlers as they were: an ignored SIGTERM would
    # be inherited by every process it starts next.
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == handlers
    err = capsys.readouterr().err
    assert f"loopd: cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "docs/runbook.md#serve-cannot-listen" in err and "Traceback" not in err
