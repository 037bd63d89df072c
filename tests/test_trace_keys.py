"""The keys a session's traces are stored under are persisted: the same for a model however often it is asked."""

from __future__ import annotations

from proxy.accounting.previous import opening_key, trace_key


def test_trace_keys_are_stable_and_per_model():
    for _ in range(3):  # the first ask and the remembered ones give one key
        assert trace_key("t1", "s1", "gpt-4o") == "t:t1:s:s1:trace:fce0337aabbb9e63"
        assert opening_key("t1", None) == "t:t1:opening:e4a6a0577479b2b4"
    assert trace_key("t1", "s1", "gpt-4o-mini") != trace_key("t1", "s1", "gpt-4o")
    long = "m" * 300  # past the remembered length: hashed each time, to the same tag
    assert trace_key("t1", "s1", long) == trace_key("t1", "s1", long) == "t:t1:s:s1:trace:c8c33e22755fe7d4"
