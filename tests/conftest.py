"""Shared fixtures: a tiny random-init real open_clip architecture and generated images.

``capscore-test-tiny`` (tests/configs/) is a test fixture, not part of capscore: it is registered here,
through ``$CAPSCORE_MODEL_CONFIGS`` so that subprocesses and Ray workers started by the tests see it too.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
TEST_CONFIGS = Path(__file__).resolve().parent / "configs"
os.environ["CAPSCORE_MODEL_CONFIGS"] = os.pathsep.join(
    filter(None, [str(TEST_CONFIGS), os.environ.get("CAPSCORE_MODEL_CONFIGS", "")]))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Never touch the user's ~/.cache/capscore from tests."""
    monkeypatch.setenv("CAPSCORE_CACHE", str(tmp_path / "capscore-cache"))
    import capscore.embed.cache as c

    monkeypatch.setattr(c, "DEFAULT_CACHE_DIR", tmp_path / "capscore-cache")


@pytest.fixture(scope="session")
def tiny_backbone():
    """capscore-test-tiny: a real open_clip CLIP (ViT + BPE text tower), random weights."""
    from capscore.backbones import load_backbone

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone("capscore-test-tiny", seed=0)


@pytest.fixture
def tiny_weights_file(tmp_path, tiny_backbone):
    """capscore-test-tiny's random weights saved as an open_clip state dict (loaded as ``capscore-test-tiny/PATH``)."""
    path = tmp_path / "tiny.pt"
    torch.save(tiny_backbone.model.state_dict(), path)
    return path


@pytest.fixture
def make_images(tmp_path):
    """Write n small RGB PNGs with distinct random content; returns their paths."""

    def make(n: int, size: int = 40, seed: int = 0, folder: str = "images"):
        rng = np.random.default_rng(seed)
        d = tmp_path / folder
        d.mkdir(exist_ok=True)
        paths = []
        for i in range(n):
            arr = (rng.random((size, size, 3)) * 255).astype("uint8")
            p = d / f"img{i}.png"
            Image.fromarray(arr).save(p)
            paths.append(p)
        return paths

    return make


@pytest.fixture(scope="session")
def tiny_open_clip():
    """capscore-test-tiny built by open_clip alone (the same random init as ``load_backbone(..., seed=0)``):
    (model, preprocess, tokenizer), for expected values computed without capscore's encoder."""
    import open_clip

    import capscore.backbones.openclip  # noqa: F401  (registers the capscore-test-tiny config with open_clip)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _, preprocess = open_clip.create_model_and_transforms("capscore-test-tiny", pretrained=None)
    return model.eval(), preprocess, open_clip.get_tokenizer("capscore-test-tiny")
