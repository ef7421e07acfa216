"""Which shard hosts a session: its family's top-level id, hashed (plain functions)."""

from __future__ import annotations

import hashlib
import re

__all__ = ["family_root", "shard_of"]

_CHILD = re.compile(r"sub-(.+)-[0-9]+", re.ASCII)


def family_root(session: str) -> str:
    """The top-level id of ``session``'s family: ``sub-<parent>-<n>`` unwrapped to the root.

    ``sub-sub-mm-thread-1-2`` is ``mm-thread``'s grandchild, so its root is ``mm-thread``. Any
    other id is its own root.
    """
    while (match := _CHILD.fullmatch(session)) is not None:
        session = match[1]
    return session


def shard_of(session: str, shards: int) -> int:
    """The shard (``0 .. shards-1``) that hosts ``session``'s family.

    A stable hash (SHA-256, not Python's per-process ``hash``), so every process of a cluster,
    and every restart, agrees.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    digest = hashlib.sha256(family_root(session).encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards
