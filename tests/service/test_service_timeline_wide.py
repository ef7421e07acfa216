"""The console's Timeline for a family of 50 sessions in a real headless Chromium: one row per
session, every row's name readable (no row drawn over another, each as tall as its text), the
one still running marked so while the 49 others show a completed turn."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_service_browser import CHROMIUM, DRIVER, WAIT, _chromium, _view, _wait

from actors import Config, LoopConfig
from actors.runtime import Runtime
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, calls, reply
from messages import ModelRequest

pytest.importorskip("selenium.webdriver")
pytestmark = [
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver"),
    pytest.mark.timeout(120),
]

TOP, WIDTH, LEAVES = "wide", 7, 6  # 1 + 7 + 7 * 6 = 50 sessions
HELD = "sub-sub-wide-1-1"  # the leaf that runs until the test ends


def family_script(release: threading.Event) -> Any:
    def script(request: ModelRequest) -> Any:
        asked = request.messages[-1].role == "user"
        if request.session == HELD:
            release.wait(WAIT)
        if asked and request.session == TOP:
            return calls(*[("subagent", {"task": f"part {n}"}) for n in range(WIDTH)])
        if asked and request.session.count("-") == 2:  # sub-wide-N: a middle child
            return calls(*[("subagent", {"task": f"leaf {n}"}) for n in range(LEAVES)])
        return reply(f"{request.session} done")

    return script


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[tuple[Any, Service]]:
    release = threading.Event()
    config = Config(home=str(tmp_path / "home"), loop=LoopConfig(max_children_total=64))
    with (
        Runtime.start(config, model=ScriptedModel(family_script(release))) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
    ):
        browser = _chromium(size="1200,800")
        try:
            browser.get(service.url + "/")
            yield browser, service
        finally:
            release.set()
            browser.quit()


ROWS_JS = """
return Array.from(document.querySelectorAll('#timeline .row')).map((row) => {
  const label = row.querySelector('.label .id');
  const box = label.getBoundingClientRect();
  return {
    session: row.dataset.session,
    cls: row.className,
    id: label.textContent,
    title: row.querySelector('.label').title,
    top: row.getBoundingClientRect().top + window.scrollY,
    bottom: row.getBoundingClientRect().bottom + window.scrollY,
    label_height: box.height,
    font: parseFloat(getComputedStyle(label).fontSize),
    completed: row.querySelectorAll('.bar.completed').length,
  };
});
"""


def test_a_family_of_50_sessions_is_one_readable_row_each(wide) -> None:
    from selenium.webdriver.common.by import By

    browser, service = wide
    _wait(browser, lambda b: b.find_element(By.ID, "link").text == "live")
    httpx.post(service.url + f"/v1/sessions/{TOP}/turns", json={"text": "go", "wait": False})
    sessions = {TOP} | {f"sub-{TOP}-{n}" for n in range(1, WIDTH + 1)}
    sessions |= {f"sub-sub-{TOP}-{m}-{n}" for m in range(1, WIDTH + 1) for n in range(1, 7)}
    assert len(sessions) == 50
    _wait(browser, lambda b: b.find_elements(By.XPATH, f"//td[text()='{TOP}']"))
    browser.find_element(By.XPATH, f"//td[text()='{TOP}']").click()
    _view(browser, "timeline")

    def settled(b: Any) -> list[dict[str, Any]] | None:
        rows: list[dict[str, Any]] = b.execute_script(ROWS_JS)
        done = sum(1 for r in rows if r["completed"])
        return rows if len(rows) == 50 and done == 47 else None  # all but HELD and its two

    rows = _wait(browser, settled)
    assert {r["session"] for r in rows} == sessions
    by_id = {r["session"]: r for r in rows}
    for held in (TOP, f"sub-{TOP}-1", HELD):
        assert "running" in by_id[held]["cls"] and not by_id[held]["completed"]
    for r in rows:
        assert r["id"] == r["session"] and r["session"] in r["title"]
        assert r["font"] >= 11 and r["label_height"] >= r["font"]  # its name is as tall as text
    tops = sorted(rows, key=lambda r: r["top"])
    for upper, lower in itertools.pairwise(tops):
        assert lower["top"] >= upper["bottom"] - 0.5, (upper["session"], lower["session"])
    # The parent comes first, each child right after its parent's row.
    order = [r["session"] for r in tops]
    assert order[0] == TOP and order[1] == f"sub-{TOP}-1" and order[2] == f"sub-sub-{TOP}-1-1"
    errors = [e for e in browser.get_log("browser") if e.get("source") == "javascript"]
    assert errors == []
