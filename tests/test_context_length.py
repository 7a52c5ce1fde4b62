"""Context length on load: LongCLIP's knowledge-preserved stretch for open_clip models, never plain interpolation."""
import warnings

import pytest
import torch

from capscore.backbones import load_backbone
from capscore.embed import Encoder
from capscore.errors import CapscoreError


def _load(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone("capscore-test-tiny", seed=0, **kw)


def test_stretch_on_load_follows_longclip_rule():
    base, long = _load(), _load(context_length=248)
    pe, st = base.model.positional_embedding.detach(), long.model.positional_embedding.detach()
    assert long.context_length == 248 and st.shape == (248, pe.shape[1])
    assert torch.equal(st[:20], pe[:20])                                   # kept
    assert torch.allclose(st[20 + 4 * 7 + 1], 0.75 * pe[27] + 0.25 * pe[28])  # 4x interpolation, r = 1
    assert torch.allclose(st[20 + 4 * 7 + 3], 0.25 * pe[27] + 0.75 * pe[28])  # r = 3
    assert torch.allclose(st[246], pe[76] + 2 / 4 * (pe[76] - pe[75]))       # extrapolated tail
    assert long.identity != base.identity                                  # never shares cached vectors


def test_short_captions_unchanged_and_long_ones_not_truncated():
    base, long = Encoder(_load()), Encoder(_load(context_length=248))
    short = ["a red cube", "two blue circles"]  # < 20 tokens: positions 0..19 are unchanged, mask is causal
    assert torch.allclose(base.encode_texts(short), long.encode_texts(short), atol=1e-6)
    text = " ".join(["a small red cube left of a large blue circle"] * 12)  # ~120 tokens
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        long.encode_texts([text])
        base.encode_texts([text])
    assert long.stats.truncated == 0 and base.stats.truncated == 1
    assert sum("truncated" in str(x.message) for x in w) == 1


def test_unsupported_context_length_is_a_clear_error():
    with pytest.raises(CapscoreError, match="248"):
        _load(context_length=100)


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_gelu_model_round_trips_through_openai_checkpoint(tmp_path, suffix):
    """scenes-tiny uses GELU; the OpenAI layout cannot say so, so the loader must not assume QuickGELU."""
    from capscore.backbones.hf_convert import save_openai_checkpoint

    src = _quiet_scenes()
    path = save_openai_checkpoint(src, tmp_path / f"m{suffix}")
    back = _quiet_load(f"ckpt:{path}")
    texts = ["a red circle", "two blue squares left of a large green star"]
    assert torch.allclose(Encoder(src).encode_texts(texts), Encoder(back).encode_texts(texts), atol=1e-6)


def _quiet_scenes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone("scenes-tiny")


def _quiet_load(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone(spec)
