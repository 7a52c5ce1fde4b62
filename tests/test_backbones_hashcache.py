"""The weights hash is remembered per weights file (path, size, mtime) and computed again when any changes."""
from __future__ import annotations

import os
import warnings

import torch

import capscore.backbones.base as base
from capscore.backbones import load_backbone


def _load(path):
    return load_backbone(f"capscore-test-tiny/{path}")


def test_hash_cached_by_path_size_mtime(tiny_weights_file, monkeypatch):
    calls = []
    real = base.weights_hash
    monkeypatch.setattr(base, "weights_hash", lambda m: calls.append(1) or real(m))
    first = _load(tiny_weights_file).identity
    assert len(calls) == 1
    assert _load(tiny_weights_file).identity == first and len(calls) == 1  # remembered: not hashed again
    # the remembered value is the parameters' hash itself
    assert f"|w={real(_load(tiny_weights_file).model)}|" in first

    st = tiny_weights_file.stat()
    os.utime(tiny_weights_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched: mtime changed
    assert _load(tiny_weights_file).identity == first and len(calls) == 2  # hashed again (same weights, same hash)

    sd = torch.load(tiny_weights_file, weights_only=True)
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.numel() > 1)
    sd[key] = sd[key] + 1.0
    torch.save(sd, tiny_weights_file)  # new content (and mtime): a different hash
    changed = _load(tiny_weights_file).identity
    assert changed != first and len(calls) == 3


def test_size_change_alone_recomputes(tiny_weights_file, monkeypatch):
    calls = []
    real = base.weights_hash
    monkeypatch.setattr(base, "weights_hash", lambda m: calls.append(1) or real(m))
    _load(tiny_weights_file).identity
    st = tiny_weights_file.stat()
    with open(tiny_weights_file, "ab") as f:  # torch.load ignores trailing bytes of a zip archive
        f.write(b"\0" * 16)
    os.utime(tiny_weights_file, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime, other size
    _load(tiny_weights_file).identity
    assert len(calls) == 2


def test_changed_weights_are_hashed_again(tiny_weights_file):
    bb = _load(tiny_weights_file)
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


def test_damaged_hash_file_is_ignored(tiny_weights_file):
    from capscore.backbones import hashcache

    hashcache.cache_file().parent.mkdir(parents=True, exist_ok=True)
    hashcache.cache_file().write_text("{not json")
    first = _load(tiny_weights_file).identity
    assert _load(tiny_weights_file).identity == first
