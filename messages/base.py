"""The base class of every message, and the one place session ids in messages are checked."""

from __future__ import annotations

from typing import Any, get_args

import msgspec

from messages.ids import SessionId, check_session_id

__all__ = ["Message"]

# Per class: the fields typed SessionId, and those typed tuple[SessionId, ...].
_ID_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _id_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    found = _ID_FIELDS.get(cls)
    if found is None:
        single, many = [], []
        for field in msgspec.structs.fields(cls):
            if field.type == SessionId or field.type == SessionId | None:
                single.append(field.name)
            elif get_args(field.type)[:1] == (SessionId,):
                many.append(field.name)
        found = _ID_FIELDS[cls] = (tuple(single), tuple(many))
    return found


class Message(msgspec.Struct, frozen=True, tag=True, forbid_unknown_fields=True):
    """Base of every value that crosses an actor boundary.

    Frozen, tagged with its class name (the ``type`` field on the wire), and strict about unknown
    fields, so any message round-trips through ``msgspec.json`` and ``msgspec.msgpack`` unchanged
    and a union of messages decodes to the right class. A message never holds a live object.

    Every field typed ``SessionId`` is checked with ``check_session_id`` when a message is built
    or decoded: an invalid id is a ``ValueError`` naming it (``msgspec.ValidationError`` when
    decoding, which is one).
    """

    def __post_init__(self) -> None:
        single, many = _id_fields(type(self))
        for name in single:
            value: Any = getattr(self, name)
            if value is not None:
                check_session_id(value)
        for name in many:
            for value in getattr(self, name):
                check_session_id(value)
