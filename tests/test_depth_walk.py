"""jsonio.deeper_than, both of its walks, against the definition of depth; body.loads_checked's byte-count shortcut.

The depth guard decides which bodies are refused before orjson writes them (proxy/wire/jsonio.py SAFE_DEPTH):
a wrong "no" would let a too-deep value reach a dump. The wide-level walk (C-level iterators, for a level of
_WIDE_LEVEL containers or more) must give exactly the narrow walk's verdicts.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from proxy.errors import BadRequest
from proxy.wire import body as wire_body
from proxy.wire import jsonio


def depth(value: Any) -> int:
    """Containers nested in `value`, by definition (a scalar: 0)."""
    if type(value) is dict:
        return 1 + max(map(depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(depth, value), default=0)
    return 0


def nested(rng: random.Random, budget: int, width: int) -> Any:
    """A random value: `width` items at its top level (a wide level below it too), three or fewer further down."""
    if budget <= 0 or rng.random() < 0.15:
        return rng.choice([1, "x", None, 2.5, True, "{[", ""])
    n = rng.randint(width // 2, width)
    below = width // 4 if width > 8 else 3
    if rng.random() < 0.5:
        return [nested(rng, budget - rng.randint(1, 3), below) for _ in range(n)]
    return {f"k{i}": nested(rng, budget - rng.randint(1, 3), below) for i in range(n)}


@pytest.mark.parametrize("width", [3, 90])  # narrow levels only; levels past _WIDE_LEVEL containers too
def test_deeper_than_is_the_definition_on_both_walks(width: int) -> None:
    rng = random.Random(width)
    wide = 0
    for _ in range(300 if width < 10 else 60):
        value = nested(rng, rng.randint(0, 12), width)
        d = depth(value)
        wide += isinstance(value, (dict, list)) and len(value) >= jsonio._WIDE_LEVEL
        for limit in (0, 1, 2, d - 1, d, d + 1):
            if limit >= 0:
                assert jsonio.deeper_than(value, limit) is (d > limit), (limit, d)
    assert width < 10 or wide, "no value had a level wide enough for the C-level walk"


def test_one_deep_branch_among_many_shallow_messages_is_found() -> None:
    """A conversation of a thousand plain messages with one nested past the limit in the middle of them."""
    deep: Any = "x"
    for _ in range(wire_body.MAX_DEPTH - 2):  # under the body, its messages list and the message: one too many
        deep = [deep]
    messages: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(1000)]
    messages[517] = {"role": "tool", "tool_call_id": "c", "content": deep}
    assert jsonio.deeper_than({"messages": messages}, wire_body.MAX_DEPTH)
    messages[517]["content"] = deep[0]  # one level less: exactly at the limit
    assert not jsonio.deeper_than({"messages": messages}, wire_body.MAX_DEPTH)


def test_load_object_refuses_a_big_deep_body_it_no_longer_counts() -> None:
    """Over _COUNT_BELOW bytes the brackets are not counted: the walk alone decides, and still refuses."""
    deep: Any = "x"
    for _ in range(wire_body.MAX_DEPTH + 5):
        deep = {"a": deep}
    padding = [{"role": "user", "content": "y" * 1000} for _ in range(100)]
    value = {"messages": [*padding, {"role": "user", "content": "z", "extra": deep}]}
    raw = orjson.dumps(value)
    assert len(raw) > wire_body._COUNT_BELOW
    with pytest.raises(BadRequest, match="nested deeper"):
        wire_body.load_object(raw)
    shallow = {"messages": padding}
    wire_body.load_object(orjson.dumps(shallow))  # no error


NUMBERS = ["18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
           "123456789012345678901234567890", "1e19", "1.5e300", "9223372036854775807.0", "0.7", "42"]


@pytest.mark.parametrize("number", NUMBERS)
@pytest.mark.parametrize("where", ["top", "message", "deep_in_a_part", "in_a_string"])
def test_loads_checked_gives_loads_value_and_deeper_than_verdict(number: str, where: str) -> None:
    """A body over jsonio._WALKED_FROM bytes is walked, not scanned: the same exact value (a big integer stays
    an int with its digits, a float stays a float) and the same depth verdict as loads and deeper_than."""
    import json

    padding = ",".join(f'{{"role":"user","content":"{"p" * 90} {i}"}}' for i in range(800))
    spots = {"top": (f'"seed":{number},', "", ""),
             "message": ("", f'{{"role":"tool","tool_call_id":"c","content":"x","n":{number}}},', ""),
             "deep_in_a_part": ("", '{"role":"user","content":[{"type":"text","text":"t","x":[[{"v":['
                                    + number + ']}]]}]},', ""),
             "in_a_string": ("", f'{{"role":"user","content":"id {number} here"}},', "")}
    top, message, _ = spots[where]
    raw = f'{{{top}"model":"m","messages":[{message}{padding}]}}'.encode()
    assert len(raw) >= jsonio._WALKED_FROM
    value, too_deep = jsonio.loads_checked(raw, wire_body.MAX_DEPTH)
    expected = jsonio.loads(raw)
    assert json.dumps(value) == json.dumps(expected)  # int and float told apart: "10" is not "10.0"
    assert too_deep is jsonio.deeper_than(expected, wire_body.MAX_DEPTH) is False


def test_loads_checked_refuses_as_loads_does_and_finds_depth_in_a_big_body() -> None:
    padding = ",".join(f'{{"role":"user","content":"{"p" * 90}"}}' for i in range(800))
    for bad in (b'{"messages":[' + padding.encode() + b',NaN]}', b'{"messages":[' + padding.encode() + b']'):
        with pytest.raises(orjson.JSONDecodeError):
            jsonio.loads(bad)
        with pytest.raises(orjson.JSONDecodeError):
            jsonio.loads_checked(bad, wire_body.MAX_DEPTH)
    deep = "[" * (wire_body.MAX_DEPTH + 3) + "1" + "]" * (wire_body.MAX_DEPTH + 3)
    raw = f'{{"messages":[{padding}],"extra":{deep}}}'.encode()
    assert jsonio.loads_checked(raw, wire_body.MAX_DEPTH)[1] is True
    with pytest.raises(BadRequest, match="nested deeper"):
        wire_body.load_object(raw)
