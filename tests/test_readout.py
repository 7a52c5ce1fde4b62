"""scenes-tiny-v4's second-order global read-out (capscore.backbones.readout): the global vector is the
flattened mean outer product of the normalised joint-space tokens, recomputed here from open_clip's
towers one item at a time; tokens keep their width; the read-out travels with the architecture name
(random init, ``ckpt:#arch=``, the recipe's exported file) and is part of the cache identity."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from capscore.backbones import load_backbone
from capscore.backbones.readout import readout_of, second_order_pool, word_mask
from capscore.embed.engine import Encoder
from capscore.errors import CapscoreError
from capscore.scenes import generate_scenes

CAPTIONS = ["a red star", "A photo depicts a blue circle to the left of a small green square.", "two stars"]


def _load(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone(spec, seed=3)


@pytest.fixture(scope="module")
def pair():
    """The same random towers under CLIP's read-out (v3) and the second-order one (v4)."""
    v3, v4 = _load("openclip:scenes-tiny-v3"), _load("openclip:scenes-tiny-v4")
    for (k, a), b in zip(v3.model.state_dict().items(), v4.model.state_dict().values()):
        assert torch.equal(a, b), k  # one init: the architectures differ in the read-out only
    return v3, v4


def test_pool_by_hand():
    tokens = torch.tensor([[[2.0, 0.0], [0.0, 3.0], [5.0, 5.0]]])
    got = second_order_pool(tokens, torch.tensor([[1.0, 1.0, 0.0]]))  # the third token masked out
    assert torch.allclose(got, torch.tensor([[0.5, 0.0, 0.0, 0.5]]))  # mean of e1e1ᵀ and e2e2ᵀ
    assert torch.equal(second_order_pool(tokens, torch.zeros(1, 3)), torch.zeros(1, 4))
    assert word_mask(torch.tensor([4, 2]), 5).tolist() == [[False, True, True, False, False], [False] * 5]
    assert readout_of("scenes-tiny-v4") == "second-order" and readout_of("ViT-B-32") == readout_of(None) == "class"


def test_global_vectors_are_the_outer_product_pools_of_the_tokens(pair):
    v3, v4 = pair
    assert (v4.embed_dim, v4.token_dim, v3.embed_dim, v3.token_dim) == (128 * 128, 128, 128, 128)
    images = [s.render() for s in generate_scenes(3, seed=5, size=96)]
    enc = Encoder(v4)
    g_img, patches = enc.image_patches(images)
    assert g_img.shape == (3, 128 * 128) and patches.shape == (3, 144, 128)
    assert torch.allclose(enc.encode_images(images), g_img, atol=1e-6)
    g_txt = enc.encode_texts(CAPTIONS)  # one padded batch of captions of different lengths
    import open_clip

    tok = open_clip.get_tokenizer("scenes-tiny-v3")
    model = v3.model
    with torch.no_grad():
        for i, im in enumerate(images):  # open_clip's own tower, one image: 144 patch tokens after the projection
            model.visual.output_tokens = True
            _, t = model.visual(v3.preprocess(im)[None])
            model.visual.output_tokens = False
            t = F.normalize(t[0] @ model.visual.proj, dim=-1)
            ref = F.normalize((t.T @ t / len(t)).flatten(), dim=0)
            assert torch.allclose(g_img[i], ref, atol=1e-5)
        for i, c in enumerate(CAPTIONS):  # unpadded, one caption: its word tokens, start and end of text dropped
            ids = tok([c])[0]
            n = int((ids != 0).sum())
            x = model.token_embedding(ids[None, :n]) + model.positional_embedding[:n]
            x = model.ln_final(model.transformer(x, attn_mask=model.attn_mask[:n, :n]))
            w = F.normalize((x[0] @ model.text_projection)[1 : n - 1], dim=-1)
            ref = F.normalize((w.T @ w / len(w)).flatten(), dim=0)
            assert torch.allclose(g_txt[i], ref, atol=1e-5), c
    # the cosine of two pools is Σ (p·w)² over the norms: a caption and its attribute swap differ
    swapped = enc.encode_texts(["a blue star and a red circle", "a red star and a blue circle"])
    assert not torch.allclose(swapped[0], swapped[1], atol=1e-3)


def test_identity_and_checkpoint_carry_the_readout(pair, tmp_path):
    from capscore.backbones.openai_ckpt import save_openai_checkpoint
    from capscore.scenes.tiny import backbone_from_file
    from capscore.train.scenes_tiny import export_bundled

    v3, v4 = pair
    path = save_openai_checkpoint(v4, tmp_path / "v4.safetensors")  # what `capscore train` exports
    as_v4, as_v3 = _load(f"ckpt:{path}"), _load(f"ckpt:{path}#arch=scenes-tiny-v3")
    assert (as_v4.readout, as_v3.readout) == ("second-order", "class")  # the file records it; #arch= overrides
    assert as_v4.identity.endswith("|readout=second-order") and as_v3.identity != as_v4.identity
    img = [generate_scenes(1, seed=2, size=96)[0].render()]
    assert torch.allclose(Encoder(as_v4).encode_images(img), Encoder(v4).encode_images(img), atol=1e-6)
    plain = save_openai_checkpoint(v3, tmp_path / "v3.safetensors")
    assert _load(f"ckpt:{plain}").readout == "class" and _load(f"ckpt:{plain}#arch=scenes-tiny-v4").readout == "second-order"
    with pytest.raises(CapscoreError, match=r"v4\.pt: .* second-order global read-out, which only a \.safetensors"):
        save_openai_checkpoint(v4, tmp_path / "v4.pt")  # a .pt file cannot record it: no silent class token
    export_bundled(v4, tmp_path / "bundled.safetensors", {"arch": "scenes-tiny-v4"})
    shipped = backbone_from_file(tmp_path / "bundled.safetensors")
    assert shipped.readout == "second-order" and shipped.embed_dim == 128 * 128
    # the same file as `ckpt:` (a scenes-tiny run's scenes-tiny.safetensors): its "arch" names the read-out
    assert _load(f"ckpt:{tmp_path / 'bundled.safetensors'}").readout == "second-order"
    export_bundled(v3, tmp_path / "bundled-v3.safetensors", {"arch": "scenes-tiny-v3"})
    assert _load(f"ckpt:{tmp_path / 'bundled-v3.safetensors'}").readout == "class"
    got = Encoder(shipped).encode_texts(CAPTIONS[:1])
    assert torch.allclose(got, Encoder(v4).encode_texts(CAPTIONS[:1]), atol=2e-3)  # fp16 weights


def test_abe_runs_and_emscore_refuses(pair):
    from capscore.scores.abe import AbeConfig, abe_components
    from capscore.scores.video import score_videos

    _, v4 = pair
    enc = Encoder(v4)
    images = [s.render() for s in generate_scenes(2, seed=6, size=96)]
    comp = abe_components(enc, images, CAPTIONS[:2], config=AbeConfig(refine=False))
    want = (enc.encode_images(images) * enc.encode_texts(CAPTIONS[:2])).sum(1)
    assert torch.allclose(comp.global_, want, atol=1e-5) and torch.isfinite(comp.final).all()
    with pytest.raises(CapscoreError, match=r"EMScore's fine-grained term .* matches word tokens .128-d. with frame embeddings .16384-d"):
        score_videos(enc, ["clip.mp4"], ["a red star"])
