"""Which shard hosts a session: its family's top-level id, hashed (plain functions)."""

from __future__ import annotations

import hashlib

from messages.ids import family_root

__all__ = ["family_root", "shard_of"]


def shard_of(session: str, shards: int) -> int:
    """The shard (``0 .. shards-1``) that hosts ``session``'s family.

    A stable hash (SHA-256, not Python's per-process ``hash``), so every process of a cluster,
    and every restart, agrees.
    """
    if shards < 1:
        raise ValueError(f"shards must be >= 1, not {shards}")
    digest = hashlib.sha256(family_root(session).encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards
