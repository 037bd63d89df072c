"""The key schema's slot groups, and the Redis names built from them: the keys one operation mixes share a slot,
and every stored name reads back to exactly its key."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from proxy.accounting.counters import inspect_key, session_record_key, texts_key, timeline_key
from proxy.store.archive import _blob_key, _quota_group
from proxy.store.keys import route_key, route_session_key, session_key, slot_group, tenant_key
from proxy.store.redis_layout import KeyLayout, by_slot

LAYOUT = KeyLayout("ctxproxy:")


@pytest.mark.parametrize(("key", "group"), [
    (tenant_key("T", "blob", "ctx_1"), "t:T"),
    (route_key("T", "coding", "decision", "offload", "h"), "t:T"),
    (session_key("T", "S", "timeline"), "t:T:s:S"),
    (route_session_key("T", "S", "coding", "compaction"), "t:T:s:S"),
    (session_key("T", "a:b", "timeline"), "t:T:s:a"),  # a ':' in a session id: still one group per session
    ("t:T:s:S", "t:T"),  # no part after the session: a tenant-wide key named s:S
    ("stats:T:coding|m|all|requests", ""),  # outside the schema: no group
    ("t:T", ""),
    ("", ""),
])
def test_slot_groups(key: str, group: str) -> None:
    assert slot_group(key) == group


def test_the_keys_one_operation_mixes_share_a_slot() -> None:
    for key in ("t:T:x", "t:T:s:S:x"):  # delete: a key's blob, counter and log
        assert len({key_slot(LAYOUT.name(kind, key)) for kind in ("b:", "c:", "l:")}) == 1, key
    books = [LAYOUT.name("q:", _quota_group("T") + part, group=_quota_group("T")) for part in (":order", ":meta")]
    counted = {key_slot(n) for n in (LAYOUT.name("b:", _blob_key("T", "ctx_1")), LAYOUT.name("b:", _blob_key("T", "z")),
                                     *books)}
    assert len(counted) == 1  # a counted put: the tenant's blobs and its quota bookkeeping
    logs = {key_slot(LAYOUT.name("l:", f("T", "S"))) for f in (timeline_key, inspect_key, texts_key)}
    assert len(logs) == 1  # one request's logs: one script
    assert slot_group(session_record_key("T", "S")) == "t:T"


@pytest.mark.parametrize("key", ["t:a:1", "t:[a]*?:1", "t:a:s:a}b:x", "t:{x}:y", "stats:T:r|m", "", "t:a:s:S:r:c:k"])
def test_a_stored_name_reads_back_to_its_key_and_nothing_else(key: str) -> None:
    name = LAYOUT.name("b:", key)
    assert LAYOUT.key_of("b:", name) == key
    assert LAYOUT.key_of("l:", name) is None and LAYOUT.key_of("lock:", LAYOUT.name("l:", key)) is None
    assert LAYOUT.key_of("b:", name, key + "x") is None
    assert KeyLayout("other:").key_of("b:", name) is None


def test_a_brace_in_a_key_never_moves_its_tag() -> None:
    """Only the first '}' closes a tag: a session id holding one still hashes with its group's own text."""
    assert key_slot(LAYOUT.name("l:", "t:T:s:a}b:timeline")) == key_slot(LAYOUT.name("b:", "t:T:s:a}b:inspect"))
    assert LAYOUT.name("b:", "stats:x").startswith(b"ctxproxy:{}")  # empty tag: Redis hashes the whole name


def test_names_group_by_slot_in_order() -> None:
    names = [LAYOUT.name("b:", k) for k in ("t:A:1", "t:B:1", "t:A:2", "t:B:2")]
    groups = by_slot(names)
    assert sorted(groups.values()) == [[0, 2], [1, 3]]
