"""The cyclic garbage collector as a process serving many turns at once wants it.

The collector is the process's, not the library's: a runtime embedded in a program leaves it
alone, and ``loopd serve``, whose process is loopd's own, sets it with :func:`tune_collector`.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

YOUNG_THRESHOLD = 50_000
"""Allocations (net of frees) between two collections of the youngest generation, against
CPython's default of 700. With hundreds of turns in flight most young objects are still alive
at 700 (a turn's coroutines, futures, messages), so each collection scans them, promotes them,
and brings the next full collection over every held session closer."""


def tune_collector(young: int = YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Make the collector scan less often and over less; returns the thresholds before.

    Collects once, then freezes every object tracked now (the imports', the runtime's and the
    service's: they live as long as the process, and one of them that later falls into a
    garbage cycle stays until it ends), so no later collection scans them again;
    then a collection of the youngest generation starts after ``young`` allocations instead of
    700. The older generations' thresholds are kept. ``gc.unfreeze()`` and
    ``gc.set_threshold(*before)`` undo it.

    Call it once everything long-lived has started. It is process-wide: ``loopd serve`` calls
    it; a program embedding the runtime may, as its own decision. Raises ``ValueError`` for a
    ``young`` below 1.
    """
    if young < 1:
        raise ValueError(f"young must be at least 1 allocation, not {young}")
    before: tuple[int, int, int] = gc.get_threshold()
    gc.collect()  # what is garbage now is freed, not frozen with the rest
    gc.freeze()
    gc.set_threshold(young, before[1], before[2])
    return before
