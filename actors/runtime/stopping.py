"""How the runtime stops its actors: in start order, with one deadline for the lot."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import pykka

__all__ = ["await_stops", "in_start_order"]

log = logging.getLogger("actors.runtime")


def in_start_order(refs: Iterable[pykka.ActorRef[Any]]) -> list[pykka.ActorRef[Any]]:
    """``refs`` in the order pykka's registry lists them (the order they started in).

    An actor that stops leaves the registry, a list: stopping the oldest first finds each one
    near its front, so stopping n actors costs O(n) rather than O(n**2).
    """
    order = {ref.actor_urn: i for i, ref in enumerate(pykka.ActorRegistry.get_all())}
    return sorted(refs, key=lambda ref: order.get(ref.actor_urn, -1))


def await_stops(what: str, futures: list[pykka.Future[bool]], timeout: float) -> bool:
    """Wait for stop ``futures`` together until ``timeout``; False (and a warning naming
    ``what``) if some have not stopped by then."""
    deadline = time.monotonic() + timeout
    for future in futures:
        try:
            future.get(timeout=max(0.0, deadline - time.monotonic()))
        except pykka.Timeout:
            log.warning("loopd: %s did not stop within the stop's deadline", what)
            return False
    return True
