"""``loopd`` imports on demand: its parser, ``--help``, ``sessions`` and ``approvals`` on a home
no service serves import none of the runtime's libraries (the speed itself is measured in
bench/bench_cli.py, never here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("aiohttp", "httpx", "starlette", "uvicorn", "mcp", "pykka", "actors.runtime", "ray")
"""What a listing command never needs."""

PROBE = """
import contextlib, io, json, sys
from actors.shells.cli import build_parser, main
build_parser()
out = io.StringIO()
for argv in ARGVS:
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""


def loaded(*argvs: list[str]) -> list[str]:
    """The modules of :data:`HEAVY` loaded after importing the CLI and running ``argvs``."""
    code = f"ARGVS = {argvs!r}\nHEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


@pytest.mark.timeout(120)
def test_the_parser_and_help_import_nothing_heavy() -> None:
    assert loaded(["--help"], ["--version"]) == []


@pytest.mark.timeout(120)
def test_the_listings_on_an_unserved_home_import_nothing_heavy(tmp_path: Path) -> None:
    demo = subprocess.run(
        [sys.executable, "-m", "actors.shells.cli", "demo", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr
    home = ["--home", str(tmp_path)]
    assert (
        loaded(
            ["sessions", *home],
            ["sessions", "--json", *home],
            ["sessions", "show", "demo", *home],
            ["approvals", *home],
            ["approvals", "--json", *home],
        )
        == []
    )
