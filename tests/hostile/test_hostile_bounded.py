"""The shared bounded decode (actors.core.bounded) against hostile JSON: every case is refused
with a detail that names what was wrong, or decoded to a value that can be stored and sent."""

from __future__ import annotations

import msgspec
import pytest
from hostile_strategies import DEEP, hostile_json, hostile_text
from hypothesis import given, settings

from actors.core.bounded import MAX_DEPTH, OutOfBounds, check_text, check_value, decode_json

pytestmark = pytest.mark.timeout(120)


@settings(max_examples=150, deadline=None)
@given(hostile_json)
def test_hostile_json_is_refused_by_name_or_decoded_to_a_storable_value(text: str) -> None:
    try:
        value = decode_json(text, max_bytes=1024 * 1024)
    except OutOfBounds as exc:
        assert exc.detail and "\n" not in exc.detail
        return
    # What passes the door can be stored (MessagePack) and sent (JSON) without an error.
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(value)) == value
    msgspec.json.encode(value)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"a": ' + "[" * DEEP + "]" * DEEP + "}", "nested deeper than 64 levels"),
        ('{"a": 1180591620717411303424}', "outside the 64-bit range at $.a"),
        ('{"a": -9223372036854775809}', "outside the 64-bit range at $.a"),
        ('{"a": 1e400}', "not finite (inf) at $.a"),
        ('{"a": NaN}', "NaN is not valid JSON"),
        ('{"a": ["\\ud800"]}', "lone surrogate (\\ud800) in a string at $.a[0]"),
        ('{"\\udc00": 1}', "lone surrogate (\\udc00) in a key"),
        ('{"a": 1', "not valid JSON"),
    ],
)
def test_each_bound_is_named(text: str, named: str) -> None:
    with pytest.raises(OutOfBounds) as refused:
        decode_json(text)
    assert named in refused.value.detail


def test_the_edges_of_the_bounds_pass() -> None:
    assert decode_json('{"a": 9223372036854775807, "b": -9223372036854775808}') == {
        "a": 2**63 - 1,
        "b": -(2**63),
    }
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert decode_json(at_limit) is not None
    with pytest.raises(OutOfBounds, match="nested deeper"):
        decode_json("[" + at_limit + "]")
    # A bracket inside a string is text, not nesting.
    assert decode_json('{"a": "' + "[" * 1000 + '"}') == {"a": "[" * 1000}


def test_size_is_checked_before_anything_is_decoded() -> None:
    with pytest.raises(OutOfBounds, match="2,000 bytes of JSON; at most 1,000"):
        decode_json(b" " * 1991 + b"[1,2,3,4]", max_bytes=1000)


def test_bytes_that_are_not_utf8_are_named() -> None:
    with pytest.raises(OutOfBounds, match="not UTF-8"):
        decode_json(b'{"a": "\xff"}')


def test_duplicate_keys_keep_the_last_once() -> None:
    assert decode_json('{"a": 1, "a": 2}') == {"a": 2}


@settings(max_examples=100, deadline=None)
@given(hostile_text)
def test_check_text_takes_valid_text_and_names_the_rest(text: str) -> None:
    try:
        checked = check_text(text, "the reason", max_chars=10_000)
    except OutOfBounds as exc:
        assert exc.detail.startswith("the reason ")
        return
    assert checked.encode("utf-8").decode("utf-8") == checked
    assert len(checked) <= 10_000


def test_check_text_names_a_wrong_type() -> None:
    with pytest.raises(TypeError, match="the note must be a str, not int"):
        check_text(5, "the note")


def test_check_value_refuses_what_json_cannot_hold() -> None:
    with pytest.raises(OutOfBounds, match=r"a set is not a JSON value at \$\.a"):
        check_value({"a": {1}})
    with pytest.raises(OutOfBounds, match="nested deeper than 3 levels"):
        check_value([[[[1]]]], max_depth=3)
    deep: list[object] = []
    node = deep
    for _ in range(DEEP):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    with pytest.raises(OutOfBounds, match="nested deeper"):
        check_value(deep)
