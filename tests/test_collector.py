"""The garbage collector set for many turns at once: ``tune_collector`` and ``loopd serve``.

The collector is process-wide, so every test puts it back as it found it.
"""

from __future__ import annotations

import gc
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors import Config, ModelConfig, tune_collector
from actors.runtime.collector import YOUNG_THRESHOLD
from actors.shells.serve import serve


@pytest.fixture
def collector() -> Iterator[tuple[int, int, int]]:
    """The collector's thresholds now; after the test, these again and nothing frozen."""
    before = gc.get_threshold()
    try:
        yield before
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_tune_collector_freezes_what_lives_and_collects_the_young_less_often(
    collector: tuple[int, int, int],
) -> None:
    kept = object.__new__(type("Kept", (), {}))  # a tracked object that exists now
    assert gc.is_tracked(kept)
    assert tune_collector() == collector
    assert gc.get_threshold() == (YOUNG_THRESHOLD, collector[1], collector[2])
    assert gc.get_freeze_count() > 0
    assert all(o is not kept for o in gc.get_objects())  # frozen: no collection scans it


def test_tune_collector_takes_a_threshold_and_refuses_one_below_1(
    collector: tuple[int, int, int],
) -> None:
    tune_collector(young=2_000)
    assert gc.get_threshold()[0] == 2_000
    with pytest.raises(ValueError, match="young must be at least 1 allocation, not 0"):
        tune_collector(young=0)
    assert gc.get_threshold()[0] == 2_000  # refused: nothing changed


def test_serve_sets_the_collector_only_when_asked(
    tmp_path: Path, collector: tuple[int, int, int]
) -> None:
    # Nothing listens at the model's URL and no job runs: the model is never asked.
    config = Config(home=str(tmp_path), model=ModelConfig(base_url="http://127.0.0.1:9/v1"))
    stop = threading.Event()
    stop.set()  # serve starts everything, then finds the stop already asked for
    assert serve(config, stop=stop, out=io.StringIO()) == 0
    assert gc.get_threshold() == collector  # an embedder's collector is left alone
    assert serve(config, stop=stop, out=io.StringIO(), tune_gc=True) == 0
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0
