"""``loopd sessions show ID`` on a served home goes through the service and prints exactly what
it prints from the store: message numbers, compaction marks, each turn's usage, children, text
and ``--json``. A real runtime and a real uvicorn on 127.0.0.1 in this process; the CLI's
``main`` on the same home, with the home's service file and then without it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_kit import WAIT

from actors import Config
from actors.core.config_tables import CompactConfig
from actors.core.turn import COMPACT_INSTRUCTION
from actors.runtime import Runtime
from actors.shells.cli import main
from actors.shells.demo import DEMO_SESSION, DEMO_TEXT, demo_script
from actors.shells.served import forget_served, record_served
from actors.shells.service.openapi import openapi_document
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, reply, with_usage
from messages import ModelRequest

TOKEN = "show-test-token-5e0a"
TOKEN_ENV = "LOOPD_SHOW_TEST_TOKEN"


def _script(request: ModelRequest) -> Any:
    """The demo (a child and a grandchild, a clock call), each answer with usage; a short
    compaction threshold, so the parent's first turn is summarised before its second."""
    if request.messages[-1].content == COMPACT_INSTRUCTION:
        return with_usage(reply(f"summary of {request.session}"), 40, 6)
    return with_usage(demo_script(request), 100 + len(request.messages), 9, cached=3)


@pytest.fixture
def served_home(tmp_path: Path) -> Iterator[tuple[Path, Service]]:
    """A home with two turns of the demo family, served (its service file written)."""
    home = tmp_path / "home"
    config = Config(home=str(home), compact=CompactConfig(threshold_chars=400))
    with (
        Runtime.start(config, model=ScriptedModel(_script)) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0, TOKEN)) as service,
    ):
        rt.run_turn(DEMO_SESSION, DEMO_TEXT, timeout=WAIT)
        rt.run_turn(DEMO_SESSION, "And after the walk?", timeout=WAIT)
        record_served(home, service.url, TOKEN_ENV)
        yield home, service


def _loopd(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_sessions_show_through_the_service_prints_what_the_store_does(
    served_home: tuple[Path, Service],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, _ = served_home
    cases = [
        ["sessions", "show", DEMO_SESSION, "--home", str(home)],
        ["sessions", "show", DEMO_SESSION, "--home", str(home), "--json"],
        ["sessions", "show", "sub-demo-1", "--home", str(home)],
        ["sessions", "show", "nope", "--home", str(home)],
    ]
    # Served: the service file names this process (it holds the home's lock), so the CLI goes
    # through the service; without the token's variable it cannot, and says so.
    code, _, err = _loopd(capsys, *cases[0])
    assert code == 2 and TOKEN_ENV in err and "needs a token" in err
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    served = [_loopd(capsys, *argv) for argv in cases]
    forget_served(home)  # the same commands read the store now
    stored = [_loopd(capsys, *argv) for argv in cases]
    assert served == stored
    text = stored[0][1]
    assert "(compacted)" in text and "[1] user (compacted)" in text  # numbers and marks
    assert "  turn 1: " in text and "  turn 2: " in text and "; with children " in text
    assert "children  sub-demo-1, sub-demo-" in text
    assert stored[1][1].splitlines()[1].startswith('{"seq":1,"compacted":true,')
    assert stored[3][0] == 2 and "is not stored" in stored[3][2]


def test_the_session_view_has_the_fields_the_openapi_document_names(
    served_home: tuple[Path, Service],
) -> None:
    _, service = served_home
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=WAIT) as client:
        view = client.get(f"/v1/sessions/{DEMO_SESSION}").json()
    path = openapi_document()["paths"]["/v1/sessions/{id}"]["get"]
    schema = path["responses"]["200"]["content"]["application/json"]["schema"]
    assert set(view) == set(schema["properties"])
    assert set(schema["required"]) <= set(view)
    history = view["history"]
    assert [h["seq"] for h in history] == list(range(1, len(history) + 1))
    assert any(h["compacted"] for h in history) and not all(h["compacted"] for h in history)
    assert len(view["turn_usage"]) == view["turns"] == 2
