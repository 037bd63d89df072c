"""The digest and token count of each message of one request, computed once (or known from its session's memo).

Transforms and accounting each look at the whole message list; asking for a
digest or a count message by message in Python would walk 1,000 messages
several times per request. Here a list asked for before (the client's, the
client's with earlier statuses re-inserted, either plus the new status) is
answered from that answer plus its new tail; the client's own list from the
session memo's prefix plus its new messages; a list made by inserting messages
into a known one (`insert`) by slicing the known answer; anything else by
object id, in C. Only messages not seen before are hashed or counted.

Every object whose id is a key here is held (`_alive`) for the request's
lifetime, so an id can never be reused by another object meanwhile; lists are
recognised by the identity of every object in them, so a list changed in place
is never taken for the one it was.

The messages new to a request are hashed and counted off the event loop (`prepare`,
before the transforms ask; proxy/offloop.py) unless all of them together are
light; light ones where they are asked for, inline.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import compress, count, repeat
from typing import Any

from proxy import offloop
from proxy.tokens.counter import default_counter, message_digest

Message = dict[str, Any]


_LISTS_KEPT = 4  # whole lists remembered per request (the client's, with statuses, as sent, ...)


def _extends(messages: Sequence[Message], objs: Sequence[Message]) -> bool:
    """Whether `messages` starts with exactly the objects `objs`, in order (checked in C)."""
    n = len(objs)
    return messages is objs or (len(messages) >= n and (n == 0 or messages[n - 1] is objs[-1])
                                and all(map(operator.is_, messages, objs)))


def chars_of(obj: Any) -> int:
    """Characters in the strings of a JSON value: what hashing and counting it costs, roughly."""
    if type(obj) is str:
        return len(obj)
    n, stack = 0, [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is str:
            n += len(o)
        elif t is dict:
            stack.extend(o.values())
        elif t is list:
            stack.extend(o)
    return n


def _facts_job(messages: Sequence[Message], digests: Sequence[bytes | None], start: int, model: str | None,
               counts: bool) -> tuple[int, list[bytes], list[int] | None]:
    """A job for the pool: from `start`, messages up to about offloop.JOB_CHARS characters (one at least)
    and offloop.JOB_ITEMS messages; where it ended, their digests (the known ones kept) and, with
    `counts`, their token counts."""
    end, size, limit = start, 0, min(len(messages), start + offloop.JOB_ITEMS)
    while end < limit and (end == start or size < offloop.JOB_CHARS):
        size += chars_of(messages[end])
        end += 1
    job = messages[start:end]
    out = [d if d is not None else message_digest(m) for m, d in zip(job, digests[start:end])]
    return end, out, default_counter.message_counts(job, model, out) if counts else None


def _spliced(base: Sequence[Any], at: Sequence[int], items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    done = 0
    for k, item in zip(at, items):
        out += base[done:k]
        out.append(item)
        done = k
    return out + list(base[done:])


class MessageFacts:
    def __init__(self, client: list[Message], model: Callable[[], str | None]) -> None:
        self.client = client
        self._model = model
        self._digests: dict[int, bytes | None] = {}  # None: given to learn() without a digest
        self._counts: dict[int, int | None] = {}
        self._alive: list[Any] = [client]
        # Whole lists answered before: (their objects, digests or None, counts or None), newest first.
        self._lists: list[tuple[tuple[Message, ...], list[bytes] | None, list[int] | None]] = []
        # The session memo's facts of the client's first messages: (objects, digests, counts or None).
        self._prefix: tuple[tuple[Message, ...], list[bytes | None], list[int | None] | None] | None = None

    def digest(self, message: Message) -> bytes:
        d = self._digests.get(id(message))
        if d is None:
            d = message_digest(message)
            self._digests[id(message)] = d
            self._alive.append(message)
        return d

    def count(self, message: Message) -> int:
        """Tokens of one message for the request's model, once per message object."""
        return self._count_list((message,))[0]

    async def prepare(self, messages: Sequence[Message], counts: bool) -> None:
        """Digests (and with `counts`, token counts) of these messages not known yet, computed off the event
        loop unless all of them together are light (offloop.is_light: then they are left for when they are
        asked for, inline, where a thread hop would cost more than the work).

        Decided by the total, not per message: 100,000 messages of 150 characters are as much work as one
        of 15 MB. The work goes in jobs of at most offloop.JOB_CHARS characters and offloop.JOB_ITEMS
        messages, awaited one by one, so the jobs of concurrent requests interleave and what the loop
        merges of each answer is a short step.
        """
        known = self._counts if counts else self._digests
        todo = list(compress(messages, map(operator.is_, map(known.get, map(id, messages)), repeat(None))))
        if not todo or offloop.is_light(todo):
            return
        digests = list(map(self._digests.get, map(id, todo)))
        model, start = self._model(), 0
        while start < len(todo):
            end, got_digests, got = await offloop.run(_facts_job, todo, digests, start, model, counts)
            ids = list(map(id, todo[start:end]))
            self._digests.update(zip(ids, got_digests))
            self._alive.append(todo[start:end])  # their ids are keys now: hold them
            if got is not None:
                self._counts.update(zip(ids, got))
            start = end

    def digests(self, messages: Sequence[Message]) -> list[bytes]:
        """The digest of each message; only messages not seen before are hashed."""
        return self._by_list(messages, self._digest_list, 1)

    def counts(self, messages: Sequence[Message]) -> list[int]:
        """Tokens of each message for the request's model (as TokenCounter.message_counts)."""
        return self._by_list(messages, self._count_list, 2)

    def learn(self, messages: Sequence[Message], digests: Sequence[bytes | None],
              counts: Sequence[int | None] | None) -> None:
        """Digests (and counts, for the request's encoding) known for these objects from elsewhere."""
        self._alive.append(messages)
        self._digests.update(zip(map(id, messages), digests))
        if counts is not None:
            self._counts.update(zip(map(id, messages), counts))

    def seed(self, known: int, digests: Sequence[bytes | None], counts: Sequence[int | None] | None) -> None:
        """Facts of the client's first `known` messages, from the session's memo: the client's own list is
        then answered from them plus its new messages, and other lists find them by object."""
        head = self.client[:known]
        self.learn(head, digests, counts)
        objs = tuple(self.client)
        self._prefix = (objs, list(digests), list(counts) if counts is not None else None)
        self._lists.insert(0, (objs, None, None))

    def known(self, messages: Sequence[Message]) -> tuple[list[bytes | None], list[int | None]]:
        """(digests, counts) computed for these objects so far, None where not."""
        for entry in self._lists:
            if entry[1] is not None and entry[2] is not None and len(entry[0]) == len(messages) \
                    and _extends(messages, entry[0]):
                return list(entry[1]), list(entry[2])
        ids = list(map(id, messages))
        return list(map(self._digests.get, ids)), list(map(self._counts.get, ids))

    def insert(self, base: list[Message], at: Sequence[int], items: Sequence[Message]) -> list[Message]:
        """`base` with `items[j]` inserted before position `at[j]` (ascending), as a new list; when `base`
        was answered before, the new list's digests and counts follow from it by the same slicing."""
        out = _spliced(base, at, items)
        for n, entry in enumerate(self._lists):
            if len(entry[0]) == len(base) and _extends(base, entry[0]):
                digests = _spliced(self._whole(n, 1, self._digest_list), at, self._digest_list(items))
                counts = _spliced(self._whole(n, 2, self._count_list), at, self._count_list(items))
                self._lists.insert(0, (tuple(out), digests, counts))
                del self._lists[_LISTS_KEPT:]
                break
        return out

    # -- lists

    def extends_client(self, messages: Sequence[Message]) -> bool:
        """Whether `messages` starts with the client's message objects, all of them, in order."""
        return _extends(messages, self.client)

    def _by_list(self, messages: Sequence[Message], compute: Callable[[Sequence[Message]], list[Any]],
                 slot: int) -> list[Any]:
        """`compute` per message, reusing the answer for a list asked before that `messages` starts with.

        The transforms pass the same lists, or one plus a message (the new
        status), several times per request; a list is recognised by the
        identity of each of its objects (in C), so a list changed in place is
        never mistaken for the one it was.
        """
        if not messages:
            return []
        for n, entry in enumerate(self._lists):
            if _extends(messages, entry[0]):
                whole = self._whole(n, slot, compute)
                m = len(entry[0])
                return whole + compute(messages[m:]) if len(messages) > m else list(whole)
        out = compute(messages)
        objs = tuple(messages)
        self._lists.insert(0, (objs, out, None) if slot == 1 else (objs, None, out))
        del self._lists[_LISTS_KEPT:]
        return list(out)

    def _whole(self, n: int, slot: int, compute: Callable[[Sequence[Message]], list[Any]]) -> list[Any]:
        """Slot 1 (digests) or 2 (counts) of remembered list n, computed once (the memo's prefix reused)."""
        entry = self._lists[n]
        whole: list[Any] | None = entry[1] if slot == 1 else entry[2]
        if whole is None:
            objs = entry[0]
            prefix = self._prefix
            known = (prefix[1] if slot == 1 else prefix[2]) if prefix is not None and objs is prefix[0] else None
            if known and all(known):
                whole = known + compute(objs[len(known):])
            else:
                whole = compute(objs)
            self._lists[n] = (objs, whole, entry[2]) if slot == 1 else (objs, entry[1], whole)
        return whole

    def _digest_list(self, messages: Sequence[Message]) -> list[bytes]:
        out = list(map(self._digests.get, map(id, messages)))
        if not all(out):  # a digest is never empty: a None is one not known yet
            for i in list(compress(count(), map(operator.is_, out, repeat(None)))):
                out[i] = self.digest(messages[i])
        return out  # type: ignore[return-value]

    def _count_list(self, messages: Sequence[Message]) -> list[int]:
        out = list(map(self._counts.get, map(id, messages)))
        if not all(out):  # a count is never zero (every message costs its overhead): a None is one not known yet
            missing = list(compress(count(), map(operator.is_, out, repeat(None))))
            todo = [messages[i] for i in missing]
            got = default_counter.message_counts(todo, self._model(), self._digest_list(todo))
            for i, m, n in zip(missing, todo, got):
                out[i] = self._counts[id(m)] = n  # its digest is known, so it is held in _alive
        return out  # type: ignore[return-value]
