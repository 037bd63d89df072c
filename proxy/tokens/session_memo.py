"""What the proxy remembers of a session's previous request, so a request costs what its new messages cost.

An agent re-sends its whole history every turn. Hashing, counting and
analysing 1,000 messages again for each of them makes the proxy's CPU time
grow with the history. The memo keeps, per (tenant, session), the previous
request's parsed client messages and what was computed about them (digests,
token counts, and facts a transform stored). The next request of the session
compares its messages with those, index by index, with Python ``==`` (C speed,
no serialising, no hashing) and reuses everything for the leading messages
that are *strictly* identical; the rest goes the ordinary way.

Guarantees:
- An optimisation only: a request's output is the same with the memo warm,
  cold or disabled (``SessionMemo(max_bytes=0)``). ``==`` alone is not strict
  enough for that (``1 == 1.0 == True``), so the leaves of a message that are
  neither strings nor null are recorded once and compared by type and value too;
  dict key order is not compared, because nothing reused depends on it (digests
  and counts are of the canonical, key-sorted JSON; facts are computed from
  values) and output messages are always rebuilt from the current request.
- Never across tenants: the key is (tenant, session).
- Bounded: least recently used sessions are dropped once the raw request bytes
  of the kept snapshots pass ``max_bytes``.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Protocol, TypeVar

from proxy import offloop
from proxy.tokens.message_facts import MessageFacts
from proxy.tokens.prefix import common_prefix


class MemoView(Protocol):
    """What the memo reads and gives of a request's conversation (proxy/request.py Conversation)."""

    raw: bytes
    client_messages: list[Any]
    memo: RequestMemo | None
    facts: MessageFacts

    @property
    def messages(self) -> list[Any]: ...

    def encoding_name(self) -> str: ...

MEMO_BYTES = 16 * 1024 * 1024  # raw request bytes of the snapshots kept in process, all sessions together
CHECKPOINTS = 2  # fold states kept per fact: after the last message and after the one before (a retried turn)

Path = tuple[Any, ...]
S = TypeVar("S")


def scalar_leaves(obj: Any) -> list[tuple[Path, Any]]:
    """(path, value) of every leaf that is not a string or null: what ``==`` may equate across types."""
    out: list[tuple[Path, Any]] = []
    stack: list[tuple[Any, Path]] = [(obj, ())]
    while stack:
        o, path = stack.pop()
        t = type(o)
        if t is dict:
            stack.extend((v, path + (k,)) for k, v in o.items())
        elif t is list:
            stack.extend((v, path + (i,)) for i, v in enumerate(o))
        elif t is not str and o is not None:
            out.append((path, o))
    return out


def _leaves_of(messages: Sequence[Any], start: int) -> dict[int, list[tuple[Path, Any]]]:
    """scalar_leaves of each message that has some, by its position (`start` the first's)."""
    return {i: found for i, m in enumerate(messages, start) if (found := scalar_leaves(m))}


def _same_leaves(message: Any, leaves: list[tuple[Path, Any]]) -> bool:
    """Whether `message` (already ``==`` to the recorded one) has the same types at those leaves."""
    for path, value in leaves:
        o = message
        for key in path:
            o = o[key]
        if type(o) is not type(value) or repr(o) != repr(value):  # repr: -0.0 == 0.0 but dumps differently
            return False
    return True


def without(items: list[Any], positions: Sequence[int]) -> list[Any]:
    """`items` less those at `positions` (ascending), by slices."""
    out, at = [], 0
    for i in positions:
        out += items[at:i]
        at = i + 1
    return out + items[at:]


@dataclass
class Snapshot:
    """One request's client messages and what was computed about them."""

    messages: list[dict[str, Any]]
    digests: list[bytes | None]
    encoding: str | None
    counts: list[int | None]
    leaves: dict[int, list[tuple[Path, Any]]]  # index -> non-string leaves, only messages that have some
    facts: dict[Any, Any]
    extras: dict[int, tuple[Any, bytes, int | None]]  # id -> (object, digest, count): proxy-built messages
    size: int


@dataclass
class RequestMemo:
    """The memo as one request sees it: how many leading messages are known, and the facts stored with them."""

    client: Sequence[Any] = ()  # the client's messages, which `known` and facts index
    known: int = 0
    held: list[Any] = field(default_factory=list)  # the snapshot's objects for those messages
    previous: dict[Any, Any] = field(default_factory=dict)  # facts of the previous request
    facts: dict[Any, Any] = field(default_factory=dict)  # facts of this request, for the next one
    leaves: dict[int, list[tuple[Path, Any]]] = field(default_factory=dict)  # of the known messages

    async def fold(self, key: Any, messages: Sequence[Any], start: Callable[[], S],
                   step: Callable[[S, int, Any], None], copy: Callable[[S], S]) -> S:
        """The state after ``step`` over every message, resumed from the previous request where it is known.

        ``step(state, i, message)`` mutates the state; it must depend only on
        the messages it is given, in order (a left fold), so that a state saved
        after message i of an identical prefix is the state recomputing would give.
        Only a fold over the client's own message list is resumed or remembered. A long fold gives the
        event loop a turn every offloop.STEP_ITEMS messages (the steps read the request's shared state).
        """
        n = len(messages)
        ours = messages is self.client
        valid = [(pos, saved) for pos, saved in self.previous.get(key, ()) if pos <= self.known] if ours else []
        at, state = valid[-1] if valid else (0, None)
        state = start() if state is None else copy(state)
        kept = dict(valid)
        async for span in offloop.spans(at, n):
            for i in span:
                if i >= n - CHECKPOINTS + 1:
                    kept[i] = copy(state)
                step(state, i, messages[i])
        kept[n] = copy(state)
        if ours:
            self.facts[key] = sorted(kept.items(), key=operator.itemgetter(0))[-CHECKPOINTS:]
        return state


class SessionMemo:
    """Snapshots of the previous request of each session, least recently used first out."""

    def __init__(self, max_bytes: int = MEMO_BYTES) -> None:
        self.max_bytes = max_bytes
        self._snaps: OrderedDict[tuple[str, str], Snapshot] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._snaps)

    @property
    def bytes(self) -> int:
        return self._bytes

    def recall(self, tenant: str, session: str, conv: MemoView) -> int:
        """Give `conv` what is known about its leading messages (nothing if the session is new or changed).

        Returns how many leading messages are known.
        """
        cur = conv.client_messages
        memo = RequestMemo(client=cur)
        conv.memo = memo
        snap = self._snaps.get((tenant, session))
        if snap is None:
            return 0
        self._snaps.move_to_end((tenant, session))
        known = common_prefix(snap.messages, cur)
        for i in sorted(snap.leaves):
            if i >= known:
                break
            if not _same_leaves(cur[i], snap.leaves[i]):
                known = i
                break
        memo.known, memo.held = known, snap.messages
        memo.previous = snap.facts
        memo.leaves = {i: v for i, v in snap.leaves.items() if i < known}
        counts = snap.counts if snap.encoding == conv.encoding_name() else None
        conv.facts.seed(known, snap.digests[:known], counts[:known] if counts is not None else None)
        for obj, digest, n in snap.extras.values():
            conv.facts.learn((obj,), (digest,), (n,) if counts is not None else None)
        return known

    async def remember(self, tenant: str, session: str, conv: MemoView) -> None:
        """`keep`, with its walk over the leaves of the messages new to the memo on the pool unless they are
        light (proxy/offloop.py): the request path's way."""
        memo = conv.memo or RequestMemo()
        new = conv.client_messages[memo.known:] if len(conv.raw) <= self.max_bytes else []
        self.keep(tenant, session, conv, await offloop.run_unless_light(new, _leaves_of, new, memo.known))

    def keep(self, tenant: str, session: str, conv: MemoView,
             new_leaves: dict[int, list[tuple[Path, Any]]] | None = None) -> None:
        """Remember `conv` (after the pipeline and accounting) for the session's next request (`new_leaves`:
        the leaves of its messages the memo did not know, when already found)."""
        key = (tenant, session)
        old = self._snaps.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        size = len(conv.raw)
        if size > self.max_bytes:
            return
        memo = conv.memo or RequestMemo()
        cur = conv.client_messages
        leaves = dict(memo.leaves)
        leaves.update(_leaves_of(cur[memo.known:], memo.known) if new_leaves is None else new_leaves)
        digests, counts = conv.facts.known(cur)
        msgs = conv.messages
        if conv.facts.extends_client(msgs):
            others = msgs[len(cur):]
        else:
            client = set(map(id, cur))
            others = list(compress(msgs, map(operator.not_, map(client.__contains__, map(id, msgs)))))
        extras = {id(m): (m, d, n) for m, d, n in zip(others, *conv.facts.known(others)) if d is not None}
        # The objects already held stay (this request's copies die with it, while still in the CPU's
        # caches, instead of the previous request's, long after): one allocation per message, ever.
        held = memo.held[:memo.known] + cur[memo.known:]
        self._snaps[key] = Snapshot(held, digests, conv.encoding_name(), counts, leaves, memo.facts, extras, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._snaps:
            _, dropped = self._snaps.popitem(last=False)
            self._bytes -= dropped.size


__all__ = ["MEMO_BYTES", "RequestMemo", "SessionMemo", "Snapshot", "scalar_leaves", "without"]
