"""Cached model files (the joined and the requantized GGUFs) are reused only while they match the
digest recorded when they were made: a file swapped or cut in the cache is made again, never
handed to llama.cpp's parser. Model-free: small stand-in parts."""
from pathlib import Path

import pytest

from llm import bundled


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DUPLEX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled, "_verified", {})
    parts = []
    for i in range(3):
        p = tmp_path / f"part{i}.bin"
        p.write_bytes(bytes([i]) * 1000)
        parts.append(p)
    return parts


def test_a_joined_file_is_reused_while_it_matches_its_digest(cache):
    out = bundled._joined(cache, "m")
    assert out.read_bytes() == b"".join(p.read_bytes() for p in cache)
    assert Path(str(out) + ".sha256").exists()
    made = out.stat().st_mtime_ns
    bundled._verified.clear()  # a new process
    assert bundled._joined(cache, "m") == out and out.stat().st_mtime_ns == made


def test_a_tampered_cache_file_of_the_same_size_is_made_again(cache, caplog):
    out = bundled._joined(cache, "m")
    data = bytearray(out.read_bytes())
    data[10] ^= 0xFF  # same size: a size check alone passes this
    out.write_bytes(bytes(data))
    bundled._verified.clear()
    again = bundled._joined(cache, "m")
    assert again.read_bytes() == b"".join(p.read_bytes() for p in cache)
    assert "does not match the digest" in caplog.text


def test_a_cache_file_without_its_digest_is_not_trusted(cache):
    out = bundled._joined(cache, "m")
    Path(str(out) + ".sha256").unlink()
    out.write_bytes(b"\x00" * out.stat().st_size)
    bundled._verified.clear()
    assert bundled._joined(cache, "m").read_bytes() == b"".join(p.read_bytes() for p in cache)
