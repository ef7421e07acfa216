"""The service's page: served without the token, self-contained (nothing from another host),
and its tree model (tree.js, run by Node) drawing a real family from a real event stream."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from service_kit import outcome

from actors import Config
from actors.runtime import Runtime
from actors.shells.demo import DEMO_SESSION, DEMO_TEXT, demo_script
from actors.shells.service.app import STATIC
from actors.shells.service.server import Service
from actors.shells.service.settings import ServiceSettings
from actors.testing import ScriptedModel, call, reply
from messages import FailReason, ModelRequest, TurnFailed

WAIT = 10.0
TOKEN = "page-test-token-4b1d"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Service, httpx.Client]]:
    config = Config(home=str(tmp_path / "home"))
    with (
        Runtime.start(config, model=ScriptedModel(demo_script)) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0, TOKEN)) as service,
        httpx.Client(base_url=service.url, timeout=WAIT) as client,
    ):
        yield service, client


def test_the_page_and_its_files_need_no_token_and_come_from_this_host_only(served) -> None:
    _, client = served
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    scripts = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    scripts = [s for s in scripts if s != "data:,"]  # the empty icon: no request at all
    assert scripts and all(s.startswith("/static/") for s in scripts)
    for path in scripts:
        got = client.get(path)
        assert got.status_code == 200, path
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/v1/sessions").status_code == 401  # the API still needs it
    for file in STATIC.iterdir():
        body = file.read_text(encoding="utf-8")
        assert "http://" not in body and "https://" not in body, file.name  # no CDN, offline


def test_the_page_reads_events_with_fetch_and_keeps_the_token_in_session_storage() -> None:
    app = (STATIC / "app.js").read_text(encoding="utf-8")
    assert "EventSource" not in app.replace("not EventSource", "")
    assert 'api("/v1/events"' in app and "getReader()" in app
    assert "sessionStorage.setItem" in app and "localStorage" not in app
    assert 'h.Authorization = "Bearer " + token' in app
    assert "token=" not in app  # never in a URL
    assert "innerHTML" not in app  # the service's text is shown as text


NODE = shutil.which("node")


def tree_of(chunks: list[str], root: str) -> dict:
    """Feed raw stream chunks to tree.js under Node; the family's tree as data."""
    script = """
const t = require(process.argv[1]);
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const parser = new t.SseParser();
const family = new t.Family(input.root);
const kinds = [];
for (const chunk of input.chunks) {
  for (const frame of parser.feed(chunk)) {
    kinds.push(frame.event);
    family.apply(JSON.parse(frame.data));
  }
}
process.stdout.write(JSON.stringify({tree: family.toJSON(), kinds: kinds}));
"""
    done = subprocess.run(
        [NODE, "-e", script, str(STATIC / "tree.js")],
        input=json.dumps({"root": root, "chunks": chunks}),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    return json.loads(done.stdout)


def capture(client: httpx.Client, post: Callable[[], object], *until: str) -> list[str]:
    """The raw text of ``/v1/events`` while ``post()`` runs, up to the frames holding each of
    ``until``, split into chunks of 7 characters (frames cut anywhere, as a network would)."""
    raw: list[str] = []
    attached = threading.Event()

    def read() -> None:
        with client.stream("GET", "/v1/events", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            attached.set()
            for chunk in r.iter_text():
                raw.append(chunk)
                if all(u in "".join(raw) for u in until):
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert attached.wait(WAIT)
    post()
    reader.join(WAIT)
    text = "".join(raw)
    last = max(text.index(u) for u in until)
    text = text[: text.index("\n\n", last) + 2]  # to the end of the last frame wanted
    return [text[i : i + 7] for i in range(0, len(text), 7)]


@pytest.mark.skipif(NODE is None, reason="needs Node to run the page's tree model")
def test_the_pages_tree_model_draws_the_demo_family_from_the_real_stream(served) -> None:
    _, client = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    until = '"type":"TurnEnded","session":"demo"'
    chunks = capture(
        client,
        lambda: client.post(
            f"/v1/sessions/{DEMO_SESSION}/turns", json={"text": DEMO_TEXT}, headers=auth
        ),
        until,
    )
    drawn = tree_of(chunks, DEMO_SESSION)
    tree = drawn["tree"]
    assert tree["id"] == "demo" and tree["state"] == "completed"
    (child,) = tree["children"]
    assert child["id"] == "sub-demo-1" and child["state"] == "completed"
    (grandchild,) = child["children"]
    assert grandchild["id"] == "sub-sub-demo-1-1" and grandchild["state"] == "completed"
    assert grandchild["text"].startswith("The clock says")
    assert "My helper reported" in tree["text"]
    assert tree["slot"] == 0 and child["slot"] is not None
    assert tree["started"] and tree["ended"]
    assert "TurnStarted" in drawn["kinds"] and "SubagentStarted" in drawn["kinds"]


@pytest.mark.skipif(NODE is None, reason="needs Node to run the page's tree model")
def test_the_pages_tree_model_marks_a_cancelled_family(tmp_path: Path) -> None:
    asked = threading.Event()
    release = threading.Event()

    def script(request: ModelRequest):
        if request.session == "boss":
            return call("subagent", task="dig")
        asked.set()
        release.wait(WAIT)
        return reply("too late")

    config = Config(home=str(tmp_path / "home"))
    answers: list[httpx.Response] = []
    with (
        Runtime.start(config, model=ScriptedModel(script)) as rt,
        Service.start(rt, ServiceSettings("127.0.0.1", 0)) as service,
        httpx.Client(base_url=service.url, timeout=WAIT) as client,
    ):
        # The turn's POST is answered once the turn ends (cancelled): its thread is joined
        # before the client closes, or it would read from a closed connection (an
        # httpx.ReadError in a thread nobody joins).
        poster = threading.Thread(
            target=lambda: answers.append(
                client.post("/v1/sessions/boss/turns", json={"text": "go"})
            ),
            daemon=True,
        )

        def run_and_cancel() -> None:
            poster.start()
            assert asked.wait(WAIT)
            client.post("/v1/sessions/boss/cancel")

        try:
            chunks = capture(
                client,
                run_and_cancel,
                '"type":"TurnEnded","session":"boss"',
                '"type":"TurnEnded","session":"sub-boss-1"',
            )
        finally:
            release.set()
            if poster.ident is not None:  # started
                poster.join(WAIT)
        assert not poster.is_alive(), "the turn's POST was not answered"
    (answer,) = answers
    failed = outcome(answer)
    assert isinstance(failed, TurnFailed) and failed.reason is FailReason.CANCELLED, failed
    tree = tree_of(chunks, "boss")["tree"]
    assert tree["state"] == "cancelled" and tree["reason"] == "cancelled"
    (child,) = tree["children"]
    assert child["id"] == "sub-boss-1" and child["state"] == "cancelled"


@pytest.mark.skipif(NODE is None, reason="needs Node to parse the page's scripts")
@pytest.mark.parametrize("name", ["app.js", "tree.js"])
def test_the_pages_scripts_parse(name: str) -> None:
    subprocess.run([NODE, "--check", str(STATIC / name)], check=True, timeout=WAIT)


@pytest.mark.skipif(NODE is None, reason="needs Node to run the page's tree model")
def test_a_stored_state_read_before_the_latest_event_does_not_undo_it() -> None:
    """The page reads a session (``running``) and meanwhile its TurnEnded arrives: the answer,
    applied after the event, must not set the node back to running."""
    script = """
const t = require(process.argv[1]);
const family = new t.Family("s");
family.apply({type: "TurnStarted", session: "s", slot: 0, at: "2026-01-01T00:00:00Z"});
family.apply({type: "TurnEnded", session: "s", completed: true, at: "2026-01-01T00:00:01Z"});
family.seed({session: "s", agent: "default", state: "running", turns: 0, children: []});
const fresh = new t.Family("q");
fresh.seed({session: "q", agent: "a", state: "running", turns: 1, children: ["sub-q-1"]});
process.stdout.write(JSON.stringify([family.toJSON(), fresh.toJSON()]));
"""
    done = subprocess.run(
        [NODE, "-e", script, str(STATIC / "tree.js")],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    ended, fresh = json.loads(done.stdout)
    assert ended["state"] == "completed" and ended["agent"] == "default"
    assert fresh["state"] == "running" and fresh["children"][0]["id"] == "sub-q-1"


@pytest.mark.skipif(NODE is None, reason="needs Node to run the page's approvals model")
def test_the_pages_approvals_list_follows_the_events_and_never_relists_a_settled_call() -> None:
    """A list read before an ApprovalSettled arrived must not bring the settled call back, and
    one read while a request arrived must not lose it."""
    script = """
const t = require(process.argv[1]);
const a = new t.Approvals();
const req = (s, id, at) => ({type: "ApprovalRequested", session: s, call_id: id, tool: "deploy",
  arguments: "{}", untrusted: false, at: at});
const out = [];
out.push(a.apply(req("b", 1, "2026-01-01T00:00:02Z")));
out.push(a.apply(req("a", 3, "2026-01-01T00:00:01Z")));
out.push(a.apply(req("a", 3, "2026-01-01T00:00:01Z")));
out.push(a.list().map((r) => r.session));
out.push(a.apply({type: "ApprovalSettled", session: "b", call_id: 1, approved: true}));
a.load([req("b", 1, "2026-01-01T00:00:02Z"), req("c", 1, "2026-01-01T00:00:03Z")]);
out.push(a.list().map((r) => r.session + "/" + r.call_id));
out.push(a.apply({type: "TurnEnded", session: "c"}));
out.push(a.waits("c"), a.waits("b"));
const before = Array.from(a.waiting.keys());
a.apply(req("d", 2, "2026-01-01T00:00:04Z"));  // came while the list was on its way
a.load([], before);  // c's call was dropped (a cancel): gone; d's stays
out.push(a.list().map((r) => r.session + "/" + r.call_id));
process.stdout.write(JSON.stringify(out));
"""
    done = subprocess.run(
        [NODE, "-e", script, str(STATIC / "tree.js")],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    assert json.loads(done.stdout) == [
        *[True, True, False, ["a", "b"], True, ["c/1"], False],
        *[True, False, ["d/2"]],
    ]
