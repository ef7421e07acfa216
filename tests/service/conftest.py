"""The service's tests: ``serve`` starts a runtime on a scripted model, served on a free port
of 127.0.0.1 by a real uvicorn, with an httpx client of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from service_kit import Served, serve_fixture


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(script, token=None, **settings)``: a served runtime (see service_kit)."""
    yield from serve_fixture(tmp_path)
