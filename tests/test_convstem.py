"""scenes-tiny-v3's convolutional stem (capscore.backbones.convstem): same token grid as the patchify
tower, local tokens, batch- and mode-independent embeddings, and a checkpoint that reloads exactly."""
from __future__ import annotations

import warnings

import pytest
import torch

from capscore.backbones import load_backbone
from capscore.backbones.convstem import ConvStem, add_conv_stem, stem_from_state_dict
from capscore.backbones.openai_ckpt import save_openai_checkpoint
from capscore.errors import CapscoreError
from capscore.scenes import generate_scenes


def _load(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone(spec, seed=3)


@pytest.fixture(scope="module")
def v3():
    bb = _load("openclip:scenes-tiny-v3")
    pixels = torch.stack([bb.preprocess(s.render()) for s in generate_scenes(5, seed=1, size=96)])
    return bb, pixels


def test_stem_gives_the_patchify_grid_and_local_tokens(v3):
    bb, pixels = v3
    stem = bb.model.visual.conv1
    assert isinstance(stem, ConvStem) and stem.channels == (32, 64, 128)
    with torch.no_grad():
        _, tokens = bb.forward_images(pixels, patches=True)
        assert tokens.shape == (5, 144, 128)  # 96 px / 8-px patches, as scenes-tiny-v2
        out = stem(pixels[:1])
        assert out.shape == (1, 128, 12, 12)
        changed = pixels[:1].clone()
        changed[..., :8, :8] += 1.0  # the first 8x8 patch only
        diff = (stem(changed) - out).abs().amax(1)[0]  # (12, 12)
    # three 3x3 stride-2 convolutions see 15 px: the first patch reaches tokens (0..1, 0..1), nothing further
    assert diff[0, 0] > 0
    assert diff[2:, :].max() == 0 and diff[:, 2:].max() == 0


def test_embedding_does_not_depend_on_the_batch_or_train_mode(v3):
    bb, pixels = v3
    with torch.no_grad():
        alone = bb.model.encode_image(pixels[2:3])
        batch = bb.model.encode_image(pixels)[2:3]
        bb.model.train()
        try:
            trained_mode = bb.model.encode_image(pixels)[2:3]
        finally:
            bb.model.eval()
    assert torch.allclose(alone, batch, atol=1e-5)
    assert torch.allclose(batch, trained_mode, atol=1e-5)  # attention kernels differ by mode, not the function


def test_checkpoint_round_trip_with_and_without_arch(v3, tmp_path):
    bb, pixels = v3
    path = save_openai_checkpoint(bb, tmp_path / "v3.safetensors")
    from safetensors.torch import load_file

    assert stem_from_state_dict(load_file(str(path))) == (32, 64, 128)
    ids = torch.tensor([bb.tokenize(["a red circle above a blue star"])[0]])
    lengths = torch.tensor([ids.shape[1]])
    with torch.no_grad():
        want_i, _ = bb.forward_images(pixels)
        want_t, _ = bb.forward_texts(ids, lengths)
        for spec in (f"ckpt:{path}", f"ckpt:{path}#arch=scenes-tiny-v3", f"openclip:scenes-tiny-v3/{path}"):
            other = _load(spec)
            assert isinstance(other.model.visual.conv1, ConvStem)
            assert torch.equal(other.forward_images(pixels)[0], want_i), spec
            assert torch.equal(other.forward_texts(ids, lengths)[0], want_t), spec


def test_patchify_checkpoints_have_no_stem(tmp_path):
    bb = _load("openclip:scenes-tiny-v2")
    path = save_openai_checkpoint(bb, tmp_path / "v2.safetensors")
    from safetensors.torch import load_file

    assert stem_from_state_dict(load_file(str(path))) is None
    assert isinstance(_load(f"ckpt:{path}").model.visual.conv1, torch.nn.Conv2d)


def test_stem_errors_are_one_line(v3, tmp_path):
    bb = _load("openclip:scenes-tiny-v2")
    with pytest.raises(CapscoreError, match="4-px patches, the tower has 8-px") as e:
        add_conv_stem(bb.model, (16, 32), where="scenes-tiny-v2")
    assert "\n" not in str(e.value)
    with pytest.raises(CapscoreError, match="weights file"):
        load_backbone(f"openclip:scenes-tiny-v3/{tmp_path}/missing.safetensors")
    from capscore.backbones.hf_convert import open_clip_to_hf_state_dict

    with pytest.raises(CapscoreError, match="convolutional stem"):
        open_clip_to_hf_state_dict(_load("openclip:scenes-tiny-v3").model)


def test_loading_weights_does_not_log_random_init(v3, tmp_path, caplog):
    """open_clip logs "No pretrained weights loaded ... Model initialized randomly." whenever it builds a
    tower with pretrained=None; capscore does that before loading a checkpoint's weights, so a user who
    loads a trained file must not be told it is random."""
    import logging

    path = save_openai_checkpoint(v3[0], tmp_path / "v3.safetensors")
    with caplog.at_level(logging.WARNING):
        for spec in (f"ckpt:{path}", f"ckpt:{path}#arch=scenes-tiny-v3", f"openclip:scenes-tiny-v3/{path}",
                     "scenes-tiny"):
            _load(spec)
        assert logging.getLogger().level == logging.WARNING  # the level caplog set is restored
    assert "initialized randomly" not in caplog.text
