"""A chat request's messages are refused or accepted alike whichever way they are checked: the short loop for a
few plain messages (`_plain`) never accepts what the full checks refuse, nor refuses anything itself."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from proxy.errors import BadRequest
from proxy.wire.chat import validate

ROLES = ["system", "user", "assistant", "tool", "developer", "function", "bogus", "", 1, None, ["user"]]
CONTENTS = ["hi", "", None, 3, [], ["text"], [{"type": "text", "text": "x"}], [{"type": 1}], [1], {"a": 1}]
EXTRAS: list[dict[str, Any]] = [{}, {"name": "n"}, {"tool_calls": None}, {"tool_call_id": "c"}, {"tool_call_id": 3},
                                {"tool_calls": []}, {"tool_calls": [{"id": "c", "function": {"name": "f"}}]},
                                {"tool_calls": [{"id": 1}]}, {"tool_calls": "x"}, {"refusal": None}]
MESSAGES: list[Any] = [{"role": r, "content": c, **x} for r, c, x in itertools.product(ROLES, CONTENTS, EXTRAS)]
MESSAGES += [{"content": "no role"}, {"role": "user"}, "a string", None, 7, ["user", "hi"]]
SHORT = validate.PLAIN_MAX  # as configured (the test sets it to -1 for the full checks alone)


def _verdict(messages: list[Any], monkeypatch: pytest.MonkeyPatch, plain_max: int) -> bool:
    monkeypatch.setattr(validate, "PLAIN_MAX", plain_max)
    return validate._messages_valid(messages)


def test_the_short_loop_agrees_with_the_full_checks(monkeypatch):
    lists = [[m] for m in MESSAGES] + [[a, b] for a, b in zip(MESSAGES, reversed(MESSAGES))]
    lists += [[{"role": "user", "content": "hi"}] * n + [m] for n in (3, SHORT - 1) for m in MESSAGES[::7]]
    plain = 0
    for messages in lists:
        full = _verdict(messages, monkeypatch, -1)
        assert _verdict(messages, monkeypatch, SHORT) == full, messages
        plain += validate._plain(messages)
    assert 0 < plain < len(lists)  # both ways were taken


def test_a_bad_message_among_plain_ones_is_still_refused_by_name():
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5}]}
    with pytest.raises(BadRequest, match=r"messages\[1\]\.content"):
        validate.check_messages(body)
    validate.check_messages({"model": "gpt-4o", "messages": body["messages"][:1]})  # the plain one alone passes
