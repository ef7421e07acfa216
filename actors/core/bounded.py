"""The bounded decode: one check for everything that comes from outside.

A model's tool-call arguments, an MCP result or schema, an HTTP body, an approval decision, an
A2A message, a config value: before anything acts on such a value it passes :func:`decode_json`
(for JSON text) or :func:`check_value` (for a value already in Python). Both refuse, with an
:class:`OutOfBounds` that names the bound and where it was broken:

- more than ``max_bytes`` of JSON text;
- nesting deeper than ``max_depth`` containers (checked before anything recursive runs, so no
  ``RecursionError`` can come out of a later encode, decode or walk);
- an integer outside the signed 64-bit range (it could not be stored or sent as MessagePack);
- a float that is not finite (JSON has no NaN or Infinity);
- text that is not valid Unicode (a lone surrogate), in a key or a value.

Duplicate keys in an object are not an error: the last one wins, once, here, and everything
after the door sees the decoded value. The work is linear in the input's size and the size is
capped, so a check never runs unbounded on whatever thread calls it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, Final

import msgspec

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_BYTES",
    "MAX_DEPTH",
    "OutOfBounds",
    "check_text",
    "check_value",
    "decode_json",
]

MAX_DEPTH: Final = 64
"""The deepest nesting of arrays and objects a door takes by default."""

MAX_BYTES: Final = 16 * 1024 * 1024
"""The most JSON text a door takes by default (16 MiB); each door may set a smaller cap."""

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


class OutOfBounds(ValueError):
    """A value from outside broke a bound; ``detail`` names the bound and where, as a door's
    refusal can quote it (``nested deeper than 64 levels at $.a[0]``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# A JSON string (escapes included), then the four brackets: used only to measure nesting, so a
# bracket inside a string never counts. The unrolled loop keeps the match linear.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_KEEP_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def _nesting(data: bytes, limit: int) -> int:
    """The deepest nesting of ``data`` taken as JSON text, strings skipped, or any number up to
    ``limit`` when it is surely no deeper than that; linear in its size."""
    opened = data.count(b"[") + data.count(b"{")
    if opened <= limit:
        return opened  # an upper bound, and under the limit: nothing more to know
    brackets = _STRING.sub(b"", data).translate(_KEEP_BRACKETS, _NOT_BRACKETS)
    # \x01 opens (+1), \xff closes (-1 as a signed byte).
    steps = memoryview(brackets).cast("b")
    return max(accumulate(steps), default=0)


def _where(path: list[str | int]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _short(key: str) -> str:
    key = key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return key if len(key) <= 40 else key[:40] + "..."


def _lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` as an escape (``\\ud800``), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(text[exc.start]):04x}"
    return None


def check_text(value: object, what: str, *, max_chars: int | None = None) -> str:
    """``value`` as a text a door may take: a ``str`` (else ``TypeError``), valid Unicode and at
    most ``max_chars`` characters (else :class:`OutOfBounds`), each error naming ``what``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    bad = _lone_surrogate(value)
    if bad is not None:
        raise OutOfBounds(f"{what} is not valid Unicode text: a lone surrogate ({bad})")
    if max_chars is not None and len(value) > max_chars:
        raise OutOfBounds(f"{what} has {len(value):,} characters; at most {max_chars:,} are taken")
    return value


def check_value(value: Any, *, max_depth: int = MAX_DEPTH) -> Any:
    """Walk a decoded value once, without recursion, and return it unchanged; raise
    :class:`OutOfBounds` for nesting past ``max_depth``, an integer outside int64, a float that
    is not finite or a string or key that is not valid Unicode. Anything that is not JSON's
    (``None``, bool, int, float, str, list, tuple, dict with str keys) is refused too."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                raise OutOfBounds(f"an integer outside the 64-bit range at {_where(path)}")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise OutOfBounds(f"a number that is not finite ({item}) at {_where(path)}")
        elif isinstance(item, str):
            bad = _lone_surrogate(item)
            if bad is not None:
                raise OutOfBounds(f"a lone surrogate ({bad}) in a string at {_where(path)}")
        elif isinstance(item, list | tuple | Mapping):
            if len(path) >= max_depth:
                raise OutOfBounds(f"nested deeper than {max_depth} levels at {_where(path)}")
            if isinstance(item, Mapping):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise OutOfBounds(f"a key that is not text at {_where(path)}")
                    bad = _lone_surrogate(key)
                    if bad is not None:
                        raise OutOfBounds(f"a lone surrogate ({bad}) in a key at {_where(path)}")
                    stack.append((child, [*path, _short(key)]))
            else:
                stack.extend((child, [*path, i]) for i, child in enumerate(item))
        else:
            raise OutOfBounds(f"a {type(item).__name__} is not a JSON value at {_where(path)}")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(
    data: bytes | str, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """Decode JSON text from outside, bounded: size first, then nesting (before any recursive
    decoder runs), then the value itself (:func:`check_value`). Every refusal is an
    :class:`OutOfBounds` whose detail says what was wrong: a bound, or what makes the text not
    JSON (a lone surrogate is named as such, not as "truncated")."""
    if isinstance(data, str):
        bad = _lone_surrogate(data)
        if bad is not None:
            raise OutOfBounds(f"not valid JSON: a lone surrogate ({bad}) in the text")
        data = data.encode("utf-8")
    if len(data) > max_bytes:
        raise OutOfBounds(f"{len(data):,} bytes of JSON; at most {max_bytes:,} are taken")
    if _nesting(data, max_depth) > max_depth:
        raise OutOfBounds(f"JSON nested deeper than {max_depth} levels")
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        # msgspec's texts can mislead ("truncated" for an escaped lone surrogate, "out of range"
        # for 1e400): the standard parser, bounded by the checks above, names the fault.
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as again:
            raise OutOfBounds(
                f"not valid JSON: not UTF-8 text ({again.reason} at byte {again.start})"
            ) from exc
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as again:
            raise OutOfBounds(f"not valid JSON: {again}") from exc
    return check_value(value, max_depth=max_depth)
