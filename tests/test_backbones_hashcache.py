"""The weights hash is remembered per weights file (path, size, mtime) and computed again when any changes."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import capscore.backbones.base as base
from capscore.backbones import load_backbone


@pytest.fixture
def weights_file(tmp_path):
    """capscore-test-tiny's random weights saved as an open_clip state dict (loaded as ARCH/PATH)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bb = load_backbone("capscore-test-tiny", seed=3)
    path = tmp_path / "tiny.pt"
    torch.save(bb.model.state_dict(), path)
    return path


def _load(path):
    return load_backbone(f"capscore-test-tiny/{path}")


def test_hash_cached_by_path_size_mtime(weights_file, monkeypatch):
    calls = []
    real = base.weights_hash
    monkeypatch.setattr(base, "weights_hash", lambda m: calls.append(1) or real(m))
    first = _load(weights_file).identity
    assert len(calls) == 1
    assert _load(weights_file).identity == first and len(calls) == 1  # remembered: not hashed again
    # the remembered value is the parameters' hash itself
    assert f"|w={real(_load(weights_file).model)}|" in first

    st = weights_file.stat()
    os.utime(weights_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: mtime changed
    assert _load(weights_file).identity == first and len(calls) == 2  # hashed again (same weights, same hash)

    sd = torch.load(weights_file, weights_only=True)
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.numel() > 1)
    sd[key] = sd[key] + 1.0
    torch.save(sd, weights_file)  # new content (and mtime): a different hash
    changed = _load(weights_file).identity
    assert changed != first and len(calls) == 3


def test_size_change_alone_recomputes(weights_file, monkeypatch):
    calls = []
    real = base.weights_hash
    monkeypatch.setattr(base, "weights_hash", lambda m: calls.append(1) or real(m))
    _load(weights_file).identity
    st = weights_file.stat()
    with open(weights_file, "ab") as f:  # torch.load ignores trailing bytes of a zip archive
        f.write(b"\0" * 16)
    os.utime(weights_file, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, other size
    _load(weights_file).identity
    assert len(calls) == 2


def test_changed_weights_are_hashed_again(weights_file):
    bb = _load(weights_file)
    before = bb.identity
    with torch.no_grad():
        next(bb.model.parameters()).add_(1.0)
    bb.invalidate_identity()  # what training does: the file's hash no longer applies
    assert bb.identity != before


def test_random_init_is_never_cached(monkeypatch, tmp_path):
    from capscore.backbones import hashcache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bb = load_backbone("capscore-test-tiny", seed=0)
    bb.identity
    assert not hashcache.cache_file().exists()


def test_damaged_hash_file_is_ignored(weights_file):
    from capscore.backbones import hashcache

    hashcache.cache_file().parent.mkdir(parents=True, exist_ok=True)
    hashcache.cache_file().write_text("{not json")
    first = _load(weights_file).identity
    assert _load(weights_file).identity == first
