"""The base class of every message."""

from __future__ import annotations

import msgspec

__all__ = ["Message"]


class Message(msgspec.Struct, frozen=True, tag=True, forbid_unknown_fields=True):
    """Base of every value that crosses an actor boundary.

    Frozen, tagged with its class name (the ``type`` field on the wire), and strict about unknown
    fields, so any message round-trips through ``msgspec.json`` and ``msgspec.msgpack`` unchanged
    and a union of messages decodes to the right class. A message never holds a live object.
    """
