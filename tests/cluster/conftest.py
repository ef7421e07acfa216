"""The cluster suite: one local Ray instance for the whole run (the PostgreSQL server and a
fresh database per test come from tests/conftest.py), and ``loopd_config`` pointing at both,
so the test kit's ``loopd_runtime`` starts a two-shard cluster runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray

from actors import Config
from actors.core.config import ClusterConfig, StoreConfig

SHARDS = 2


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    # Two CPUs are enough: a shard books none (num_cpus=0), it waits on the model and the store.
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture
def pg_url(pg_database: Callable[[], str]) -> str:
    """This test's own database."""
    return pg_database()


@pytest.fixture
def loopd_config(tmp_path: Path, pg_url: str, ray_local: None) -> Config:
    """A two-shard Ray cluster over this test's database."""
    return Config(
        home=str(tmp_path / "home"),
        store=StoreConfig(url=pg_url),
        cluster=ClusterConfig(engine="ray", address="local", shards=SHARDS, max_restarts=4),
    )
