"""proxy.tokens.encodings: offline encodings (seeding tiktoken's cache, no downloads), model mapping."""

from __future__ import annotations

import gzip
import hashlib
import os
import socket

import pytest
import tiktoken.load
import tiktoken.registry

from proxy.tokens import encodings
from proxy.tokens.encodings import (
    TokenizerUnavailable,
    encoding_for_model,
    encoding_name_for_model,
    ensure_encodings,
)

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
O200K_SHA = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CL100K_SHA = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


@pytest.fixture(autouse=True, scope="module")
def _private_tiktoken_cache(tmp_path_factory):
    """Keep this module from writing into the real home cache or leaking TIKTOKEN_CACHE_DIR."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        yield


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection or resolve a name fails the test loudly."""
    attempts: list[object] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


@pytest.fixture
def cold_encodings(monkeypatch):
    """Forget every loaded encoding, ours and tiktoken's, so the next load reads files."""
    monkeypatch.setattr(encodings, "_encodings", {})
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})


# --------------------------------------------------------------------------- offline loading


def test_both_encodings_load_from_a_fresh_cache_dir_without_network(tmp_path, monkeypatch, no_network,
                                                                     cold_encodings):
    cache = tmp_path / "fresh"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))

    o200k = encodings.get_encoding("o200k_base")
    cl100k = encodings.get_encoding("cl100k_base")

    assert o200k.encode_ordinary("hello world") == [24912, 2375]
    assert cl100k.encode_ordinary("hello world") == [15339, 1917]
    # tiktoken read the files we seeded, under its own cache-key scheme
    for url, sha in ((O200K_URL, O200K_SHA), (CL100K_URL, CL100K_SHA)):
        path = cache / hashlib.sha1(url.encode()).hexdigest()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha
    assert no_network == []
    assert not list(cache.glob("*.tmp"))


def test_loaded_encodings_are_memoized(cold_encodings):
    assert encodings.get_encoding("o200k_base") is encodings.get_encoding("o200k_base")


def test_without_tiktoken_cache_dir_seeds_the_ctxproxy_dir_and_points_tiktoken_at_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("CTXPROXY_TIKTOKEN_DIR", str(tmp_path / "ctx"))

    seeded = ensure_encodings()

    assert seeded.cache_dir == tmp_path / "ctx"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path / "ctx")
    assert seeded.sha256 == {"o200k_base": O200K_SHA, "cl100k_base": CL100K_SHA}
    assert (tmp_path / "ctx" / hashlib.sha1(O200K_URL.encode()).hexdigest()).is_file()


def test_without_any_override_seeds_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.delenv("CTXPROXY_TIKTOKEN_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    assert ensure_encodings().cache_dir == tmp_path / "xdg" / "ctxproxy" / "tiktoken"


def test_unwritable_ctxproxy_dir_falls_back_to_a_temp_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # mkdir below it fails even for root
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    monkeypatch.setenv("CTXPROXY_TIKTOKEN_DIR", str(blocker / "tiktoken"))

    seeded = ensure_encodings()

    assert seeded.cache_dir != blocker / "tiktoken"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(seeded.cache_dir)
    assert (seeded.cache_dir / hashlib.sha1(CL100K_URL.encode()).hexdigest()).is_file()


def test_unwritable_user_tiktoken_cache_dir_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(TokenizerUnavailable, match="TIKTOKEN_CACHE_DIR"):
        ensure_encodings()


def test_seeding_keeps_valid_files_and_replaces_bad_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    ensure_encodings()
    o200k = tmp_path / hashlib.sha1(O200K_URL.encode()).hexdigest()
    cl100k = tmp_path / hashlib.sha1(CL100K_URL.encode()).hexdigest()
    o200k_inode = o200k.stat().st_ino
    cl100k.write_bytes(b"truncated")

    ensure_encodings()

    assert o200k.stat().st_ino == o200k_inode  # untouched
    assert hashlib.sha256(cl100k.read_bytes()).hexdigest() == CL100K_SHA  # repaired


def _fake_shipped(monkeypatch, tmp_path, payload: bytes) -> None:
    fake = tmp_path / "shipped.tiktoken.gz"
    fake.write_bytes(payload)
    monkeypatch.setattr(encodings, "_shipped_path", lambda resource: fake)


@pytest.mark.parametrize("payload", [
    gzip.compress(b"aGVsbG8= 0\n"),  # valid gzip, wrong contents
    b"this is not gzip at all",
], ids=["wrong-hash", "not-gzip"])
def test_corrupt_shipped_file_raises_tokenizer_unavailable(tmp_path, monkeypatch, no_network, cold_encodings,
                                                           payload):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    _fake_shipped(monkeypatch, tmp_path, payload)

    with pytest.raises(TokenizerUnavailable) as direct:
        ensure_encodings(["o200k_base"])
    with pytest.raises(TokenizerUnavailable) as via_load:
        encodings.get_encoding("o200k_base")

    for info in (direct, via_load):
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith("o200k_base: shipped file ")
        assert " is corrupt " in message  # (tmp_path itself contains the word "corrupt")
    assert no_network == []
    assert not (tmp_path / "cache").exists()  # nothing was written for tiktoken to read


def test_tiktoken_never_downloads_even_if_its_cache_misses(tmp_path, monkeypatch, cold_encodings):
    # Simulate tiktoken and us disagreeing on the cache file name.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(encodings, "_cache_file_name",
                        lambda url: "elsewhere-" + hashlib.sha1(url.encode()).hexdigest())
    original_read_file = tiktoken.load.read_file

    with pytest.raises(TokenizerUnavailable, match="tried to download"):
        encodings.get_encoding("cl100k_base")
    assert tiktoken.load.read_file is original_read_file


def test_module_main_seeds_and_prints_dir_and_hashes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert encodings.main() == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and O200K_SHA in out and CL100K_SHA in out


# --------------------------------------------------------------------------- model -> encoding


@pytest.mark.parametrize("model,expected", [
    ("gpt-4o", "o200k_base"),
    ("gpt-4o-mini-2024-07-18", "o200k_base"),
    ("gpt-4.1-nano", "o200k_base"),
    ("gpt-4.5-preview", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("gpt-5-mini", "o200k_base"),
    ("o1-preview", "o200k_base"),
    ("o3-mini", "o200k_base"),
    ("o4-mini", "o200k_base"),
    ("chatgpt-4o-latest", "o200k_base"),
    ("gpt-oss-120b", "o200k_base"),
    ("openai/gpt-4o", "o200k_base"),
    ("openrouter/openai/gpt-oss-20b", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-4-turbo", "cl100k_base"),
    ("gpt-4-0613", "cl100k_base"),
    ("gpt-3.5-turbo", "cl100k_base"),
    ("gpt-35-turbo", "cl100k_base"),
    ("openai/gpt-4", "cl100k_base"),
    ("ft:gpt-3.5-turbo:acme::abc123", "cl100k_base"),
    ("text-embedding-3-small", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
    ("claude-sonnet-4", "o200k_base"),
    ("", "o200k_base"),
    (None, "o200k_base"),
])
def test_model_names_map_to_encodings(model, expected):
    assert encoding_name_for_model(model) == expected
    assert encoding_for_model(model).name == expected
