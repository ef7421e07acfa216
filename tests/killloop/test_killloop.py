"""SPEC's crash guarantees, proven by killing: the kill loop of killloop.py as a test.

``LOOPD_KILLLOOP_ITERATIONS`` (default 30) sets the number of kills, ``LOOPD_KILLLOOP_SEED``
the loop's seed (printed either way). Every guarantee must hold after every kill: the test fails
on the first iteration that broke one, with the seed and a one-line repro.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
from killloop import report, run

ITERATIONS = int(os.environ.get("LOOPD_KILLLOOP_ITERATIONS", "30"))


@pytest.mark.timeout(max(300, 10 * ITERATIONS))
def test_every_guarantee_holds_after_every_kill(tmp_path: Path) -> None:
    seed = int(os.environ.get("LOOPD_KILLLOOP_SEED") or random.randrange(1 << 30))
    started = time.monotonic()
    tally = run(ITERATIONS, seed, tmp_path)
    summary = report(tally, seed, time.monotonic() - started)
    print("\n" + summary)
    assert tally.iterations == ITERATIONS
    assert not tally.violations, summary
    assert not tally.orphans, summary  # no MCP server outlives its driver
