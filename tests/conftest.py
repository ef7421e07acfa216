"""loopd's own suite uses the public test kit (the pytest11 plugin) and pytest's pytester.

It also holds the PostgreSQL fixtures (started only by a test that asks for them: the cluster
suite, and the store tests' PostgreSQL runs in `tox -e cluster`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from actors.testing.postgres import PostgresServer

# actor_leak_guard: each test leaves pykka's registry as it found it, pass or fail (an actor a
# test leaves running is stopped after it, and that test, only that one, errors).
pytest_plugins = ["pytester", "actor_leak_guard"]

# tests/cluster needs PostgreSQL and Ray and takes minutes: it runs in its own tox env
# (`tox -e cluster`, which sets LOOPD_CLUSTER_TESTS=1), never in the default suite.
collect_ignore = [] if os.environ.get("LOOPD_CLUSTER_TESTS") == "1" else ["cluster"]

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run (the system's initdb and pg_ctl)."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def pg_database(pg_server: PostgresServer) -> Callable[[], str]:
    """A factory of fresh, empty databases on the run's server: their urls."""
    return lambda: pg_server.create_database(f"loopd_test_{next(_databases)}")
