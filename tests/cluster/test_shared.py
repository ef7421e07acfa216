"""What a PostgreSQL store shares between processes: memory entries, one runner per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors import Config, ModelConfig, Runtime
from actors.core.config import StoreConfig
from actors.shells.cli import main
from actors.stores.memory import MemoryFailure
from actors.stores.postgres import PgMemory, PgSessionStore, SessionHeldElsewhere
from actors.testing import call, reply
from messages import FailReason, TurnCompleted, TurnFailed, Usage


def unmeasured(n: int) -> Usage:
    """The usage of ``n`` requests whose server reported no usage: counted, unmeasured."""
    return Usage(requests=n, unmeasured_requests=n)


WAIT = 30.0


def config(tmp_path: Path, name: str, url: str, base_url: str) -> Config:
    model = ModelConfig(base_url=base_url, name="local", retries=0)
    return Config(home=str(tmp_path / name), model=model, store=StoreConfig(url=url))


def test_a_line_remembered_in_one_process_reaches_new_baselines_in_another(
    chat_server, tmp_path: Path, pg_url: str
) -> None:
    def script(body: dict[str, Any]) -> Any:
        if body["messages"][-1]["role"] == "user" and "remember" in body["messages"][-1]["content"]:
            return call("remember", text="The user's name is Ana.\nShe likes tea.")
        return reply("ok")

    server = chat_server(script)
    with (
        Runtime.start(config(tmp_path, "a", pg_url, server.base_url)) as first,
        Runtime.start(config(tmp_path, "b", pg_url, server.base_url)) as second,
    ):
        assert first.run_turn("writer", "please remember", timeout=WAIT) == TurnCompleted(
            "writer", "ok", usage=unmeasured(2)
        )
        assert second.run_turn("reader", "hello", timeout=WAIT) == TurnCompleted(
            "reader", "ok", usage=unmeasured(1)
        )
    writer_system = server.requests[0]["messages"][0]["content"]
    reader_system = server.requests[-1]["messages"][0]["content"]
    assert "Ana" not in writer_system  # a running session's baseline never changes
    assert reader_system.endswith("# Memory\n\n- The user's name is Ana. She likes tea.")


def test_two_processes_never_run_one_session(chat_server, tmp_path: Path, pg_url: str) -> None:
    server = chat_server(lambda body: reply("ok"))
    with Runtime.start(config(tmp_path, "a", pg_url, server.base_url)) as first:
        assert first.run_turn("s", "one", timeout=WAIT) == TurnCompleted(
            "s", "ok", usage=unmeasured(1)
        )
        with Runtime.start(config(tmp_path, "b", pg_url, server.base_url)) as second:
            busy = second.run_turn("s", "two", timeout=WAIT)
            assert isinstance(busy, TurnFailed) and busy.reason is FailReason.BUSY
    # The first runtime stopped: its lock went with its connection.
    with Runtime.start(config(tmp_path, "b", pg_url, server.base_url)) as second:
        assert second.run_turn("s", "three", timeout=WAIT) == TurnCompleted(
            "s", "ok", usage=unmeasured(1)
        )
    assert [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "user"] == [
        "one",
        "three",
    ]


def test_shared_memory_keeps_its_limits(pg_url: str) -> None:
    memory = PgMemory(pg_url, max_chars=30, max_entry_chars=16)
    try:
        memory.remember("tea,\n  not   coffee")
        assert memory.block() == "- tea, not coffee\n"
        with pytest.raises(MemoryFailure, match="max_entry_chars allows 16"):
            memory.remember("a much longer entry")
        with pytest.raises(MemoryFailure, match="memory is full"):
            memory.remember("second line")  # 18 + 14 characters > 30
        with pytest.raises(MemoryFailure, match="empty"):
            memory.remember(" \n ")
        assert PgMemory(pg_url).block() == "- tea, not coffee\n"  # what another process reads
    finally:
        memory.close()


def test_loopd_sessions_reads_the_postgresql_store(
    chat_server, tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = chat_server([reply("stored in postgres")])
    with Runtime.start(config(tmp_path, "a", pg_url, server.base_url)) as rt:
        assert rt.run_turn("s", "hello", timeout=WAIT) == TurnCompleted(
            "s", "stored in postgres", usage=unmeasured(1)
        )
    toml = tmp_path / "loopd.toml"
    toml.write_text(f'home = "{tmp_path / "elsewhere"}"\n[store]\nurl = "{pg_url}"\n')
    capsys.readouterr()
    assert main(["sessions", "--config", str(toml)]) == 0
    listing = capsys.readouterr().out
    assert listing.splitlines()[1].split()[:7] == ["s", "default", "completed", "0", "1", "no", "2"]
    assert main(["sessions", "show", "s", "--config", str(toml)]) == 0
    assert "stored in postgres" in capsys.readouterr().out
    assert not (tmp_path / "elsewhere" / "loopd.db").exists()


def test_a_passivated_session_lets_another_process_take_it(
    chat_server, tmp_path: Path, pg_url: str
) -> None:
    server = chat_server(lambda body: reply("ok"))
    cfg = config(tmp_path, "a", pg_url, server.base_url)
    cfg = cfg.replace(sessions=msgspec.structs.replace(cfg.sessions, max_live=1))
    with Runtime.start(cfg) as rt, PgSessionStore(pg_url) as other:
        assert rt.run_turn("first", "one", timeout=WAIT) == TurnCompleted(
            "first", "ok", usage=unmeasured(1)
        )
        (held,) = other.run_batch([("first", lambda cur: other.open_in(cur, "first"))])
        assert isinstance(held, SessionHeldElsewhere)
        # Opening a second session passivates the first (max_live = 1), and lets go of it; a
        # second turn of "second" is stored after that release.
        assert rt.run_turn("second", "two", timeout=WAIT) == TurnCompleted(
            "second", "ok", usage=unmeasured(1)
        )
        assert rt.run_turn("second", "three", timeout=WAIT) == TurnCompleted(
            "second", "ok", usage=unmeasured(1)
        )
        (taken,) = other.run_batch([("first", lambda cur: other.open_in(cur, "first"))])
        assert not isinstance(taken, Exception), taken
        busy = rt.run_turn("first", "four", timeout=WAIT)
        assert isinstance(busy, TurnFailed) and busy.reason is FailReason.BUSY
        other.release("first")
        assert rt.run_turn("first", "five", timeout=WAIT) == TurnCompleted(
            "first", "ok", usage=unmeasured(1)
        )
