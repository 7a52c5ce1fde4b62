"""LongCLIP stretching in a live tower, frozen rows, freezing by name, export -> ckpt: loader round trip."""
from __future__ import annotations

import warnings

import pytest
import torch

from capscore.errors import CapscoreError


def fresh():
    from capscore.backbones import load_backbone

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone("capscore-test-tiny", seed=0)


def test_stretch_positions_exact():
    from capscore.train.surgery import stretch_text_tower

    bb = fresh()
    pe = bb.model.positional_embedding.detach().clone()  # (77, 32)
    stretch_text_tower(bb)
    new = bb.model.positional_embedding.detach()
    assert new.shape == (248, 32) and bb.context_length == 248 and bb.model.attn_mask.shape == (248, 248)
    assert torch.equal(new[:20], pe[:20])  # kept rows
    assert torch.equal(new[20], pe[20])  # r = 0 of the first gap
    assert torch.allclose(new[21], 0.75 * pe[20] + 0.25 * pe[21])
    assert torch.allclose(new[22], 0.5 * pe[20] + 0.5 * pe[21])
    assert torch.allclose(new[20 + 4 * 10 + 3], 0.25 * pe[30] + 0.75 * pe[31])
    assert torch.equal(new[244], pe[76])  # interpolation ends at the last original row
    assert torch.allclose(new[247], pe[76] + 0.75 * (pe[76] - pe[75]))  # extrapolated tail
    # the causal mask grew with it
    assert bb.model.attn_mask[247, 246] == 0 and bb.model.attn_mask[246, 247] == float("-inf")
    with pytest.raises(CapscoreError, match="already stretched"):
        stretch_text_tower(bb)


def test_frozen_rows_survive_adamw_training():
    from capscore.train.data import scene_examples
    from capscore.train.loop import TrainConfig, train
    from capscore.train.recipes import get_recipe, make_step, resolve_params

    bb = fresh()
    r = get_recipe("contrastive")
    p = resolve_params(r, {"stretch": "1"})
    r.prepare(bb, p)
    before = bb.model.positional_embedding.detach().clone()
    ex = scene_examples(8, seed=3)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        train(bb, make_step(r, p), ex, TrainConfig(steps=3, batch_size=8, lr=1e-2, warmup=1, weight_decay=0.5), d)
    after = bb.model.positional_embedding.detach()
    assert torch.equal(after[:20], before[:20])
    assert not torch.allclose(after[20:], before[20:])


def test_freeze_by_name_and_tower():
    from capscore.train.surgery import freeze, freeze_tower

    bb = fresh()
    frozen = freeze_tower(bb, "image")
    assert frozen and all(n.startswith("visual.") for n in frozen)
    params = dict(bb.model.named_parameters())
    assert not params["visual.conv1.weight"].requires_grad and params["token_embedding.weight"].requires_grad
    assert freeze(bb.model, ["transformer.resblocks.0.*"]) and not params["transformer.resblocks.0.mlp.c_fc.weight"].requires_grad
    assert params["transformer.resblocks.1.mlp.c_fc.weight"].requires_grad
    with pytest.raises(CapscoreError, match="matches no parameter"):
        freeze(bb.model, ["no_such_layer.*"])
    with pytest.raises(CapscoreError, match="unknown tower"):
        freeze_tower(bb, "audio")


def test_stretched_export_reloads_identically(tmp_path):
    from capscore.backbones import load_backbone
    from capscore.backbones.openai_ckpt import read_state_dict
    from capscore.train.export import export_model
    from capscore.train.surgery import stretch_text_tower

    bb = stretch_text_tower(fresh())
    with torch.no_grad():  # make rows >= 20 differ from the stretched init, as training would
        bb.model.positional_embedding[20:] += 0.01 * torch.randn(228, 32, generator=torch.Generator().manual_seed(0))
    path = export_model(bb, tmp_path / "long.safetensors")
    sd = read_state_dict(path)
    assert sd["positional_embedding"].shape == (248, 32) and "positional_embedding_res" in sd
    assert torch.equal(sd["positional_embedding_res"][20:], bb.model.positional_embedding.detach()[20:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = load_backbone(f"ckpt:{path}")
    assert back.context_length == 248
    ids = torch.randint(1, 49000, (2, 200), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([200, 120])
    px = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(back.forward_texts(ids, lengths)[0], bb.forward_texts(ids, lengths)[0])
        assert torch.equal(back.forward_images(px)[0], bb.forward_images(px)[0])
