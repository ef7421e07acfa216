"""SPEC's crash guarantees on PostgreSQL, proven by killing: the kill loop of
tests/killloop/killloop.py on a store shared by several processes, with its faults.

Each iteration SIGKILLs a loopd process as on SQLite and draws a fault besides: a restart of
the PostgreSQL server while the process works, a second process (a second home, the same
store) that starts and stops while the first still holds its sessions, or the settling start on
a second home. ``LOOPD_KILLLOOP_PG_ITERATIONS`` (default 20) sets the number of iterations,
``LOOPD_KILLLOOP_PG_SEED`` the loop's seed (printed either way). The test fails on any broken
guarantee, with the seed and a one-line repro.

The loop restarts its server, so it starts a server of its own, not the suite's ``pg_server``.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

from actors.testing.postgres import PostgresServer, find_pg_bin

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "killloop"))

from killloop import Postgres, report, restart_of, run

ITERATIONS = int(os.environ.get("LOOPD_KILLLOOP_PG_ITERATIONS", "20"))

pytestmark = pytest.mark.skipif(find_pg_bin() is None, reason="PostgreSQL's initdb not found")


@pytest.mark.timeout(max(600, 15 * ITERATIONS))
def test_every_guarantee_holds_after_every_kill_on_postgres(tmp_path: Path) -> None:
    seed = int(os.environ.get("LOOPD_KILLLOOP_PG_SEED") or random.randrange(1 << 30))
    started = time.monotonic()
    with PostgresServer() as server:
        url = server.create_database("loopd_killloop")
        tally = run(ITERATIONS, seed, tmp_path, postgres=Postgres(url, restart_of(server)))
    summary = report(tally, seed, time.monotonic() - started, postgres=True)
    print("\n" + summary)
    assert tally.iterations == ITERATIONS
    assert not tally.violations, summary
