"""Conformance: every adapter in the registry and every metric in METRICS passes one contract.

The cases are generated from ``ADAPTERS`` and ``METRICS``: adding an adapter or a
metric without adding it here fails ``test_every_registry_row_is_covered``.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from capscore.backbones import ADAPTERS, load_backbone
from capscore.embed import Encoder
from capscore.scores import METRICS, GlobalCosine, metric_names
from test_metric_registry import metric_case

TEXTS = ["a dog", "a red cube left of a blue circle", "a dog", "x"]


def _quiet(fn, *a, **k):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **k)


def _mclip(folder):
    from transformers import BertConfig, BertModel, BertTokenizer

    from capscore.backbones.multilingual import save_multilingual

    words = ["a", "dog", "red", "cube", "left", "of", "blue", "circle", "x"]
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=len(words) + 5, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=40), add_pooling_layer=False).eval()
    out = save_multilingual(folder / "student", text_model=bert, tokenizer=BertTokenizer(str(folder / "vocab.txt")),
                            projection=torch.nn.Linear(16, 32), image_spec="capscore-test-tiny", image_seed=0)
    return f"mclip:{out}"


def _fgclip(hf_folder, folder):
    """The HF copy of capscore-test-tiny plus FG-CLIP's extra tensors (long positions, long projection)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(hf_folder, folder)
    sd = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    width = sd["text_model.embeddings.position_embedding.weight"].shape[1]
    sd["text_model.embeddings.position_embedding_res.weight"] = 0.01 * torch.randn(248, width, generator=g)
    sd["text_model.embeddings.position_embedding_ori.weight"] = 0.01 * torch.randn(248, width, generator=g)
    sd["text_filip_projection.weight"] = sd["text_projection.weight"].clone()
    save_file(sd, str(folder / "model.safetensors"))
    return f"fgclip:{folder}"


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """One --model spec per adapter row, each a real (small) architecture."""
    from capscore.backbones.hf_convert import save_open_clip_as_hf, save_openai_checkpoint

    d = tmp_path_factory.mktemp("conformance")
    tiny = _quiet(load_backbone, "capscore-test-tiny", seed=3)
    hf = save_open_clip_as_hf(tiny, d / "hf")
    return {
        "openclip": "capscore-test-tiny",
        "bundled": "scenes-tiny",
        "ckpt": f"ckpt:{save_openai_checkpoint(tiny, d / 'tiny.pt')}",
        "hf": f"hf:{hf}",
        "mclip": _mclip(d),
        "fgclip": _fgclip(hf, d / "fgclip"),
    }


def test_every_registry_row_is_covered(specs):
    assert set(specs) == set(ADAPTERS)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    d = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        p = d / f"{i}.png"
        Image.fromarray((rng.random((48, 40, 3)) * 255).astype("uint8")).save(p)
        paths.append(p)
    return paths


@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_backbone_contract(family, specs, images):
    bb = _quiet(load_backbone, specs[family])
    enc = Encoder(bb, batch_size=2)
    t, i = enc.encode_texts(TEXTS), enc.encode_images(images)
    # normalised float32 vectors of the declared width, in input order, duplicates identical
    assert t.shape == (4, bb.embed_dim) and i.shape == (3, bb.embed_dim) and t.dtype == torch.float32
    assert torch.allclose(t.norm(dim=-1), torch.ones(4), atol=1e-5)
    assert torch.allclose(i.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert torch.equal(t[0], t[2]) and enc.stats.texts_encoded == 3
    # batching never changes a vector: one at a time equals batched
    single = torch.cat([Encoder(bb).encode_texts([x]) for x in TEXTS])
    assert torch.allclose(single, t, atol=1e-5)
    # tokenisation is untruncated and ends with the end token the engine keeps
    ids = bb.tokenize(["a dog"])[0]
    assert len(ids) >= 2 and bb.truncate(ids) == ids
    # identity: stable across loads of the same weights, and it names the family's spec
    again = _quiet(load_backbone, specs[family])
    assert again.identity == bb.identity and specs[family].split(":")[-1][:8] in bb.identity
    if bb.has_patch_tokens:
        g, p = enc.image_patches(images)
        assert p.ndim == 3 and p.shape[0] == 3 and p.shape[2] == bb.embed_dim
        assert torch.allclose(g, i, atol=1e-5)
    if bb.has_token_features:
        (f,) = enc.text_tokens(["a dog"])
        assert f.vectors.shape == (len(f.ids), bb.embed_dim) and torch.allclose(f.global_, t[0], atol=1e-5)


CLIP_FAMILY = sorted(n for n, m in METRICS.items() if isinstance(m.image, GlobalCosine))


def test_clip_family_rows_are_the_paper_weights():
    assert CLIP_FAMILY == ["clip-s", "cosine", "mcs", "pac-s", "refclip-s", "refpac-s"]
    # Hessel et al. eq. 1 (w = 2.5), PAC-S (w = 2), PR-MCS §3.1 (w = 2.5); the cosine is unweighted, unclamped
    assert {n: (METRICS[n].w, METRICS[n].clamp) for n in CLIP_FAMILY} == {
        "clip-s": (2.5, True), "refclip-s": (2.5, True), "pac-s": (2.0, True), "refpac-s": (2.0, True),
        "mcs": (2.5, True), "cosine": (1.0, False)}


@pytest.mark.parametrize("name", CLIP_FAMILY)
def test_metric_contract(name):
    """Every CLIPScore-family formula: in [0, w], 0 for opposite vectors, w·cos for the reference-free ones;
    the unclamped cosine: exactly cos, in [-1, 1]."""
    m = METRICS[name].image
    torch.manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(16, 8), dim=-1)
    txt = torch.nn.functional.normalize(torch.randn(16, 8), dim=-1)
    refs = torch.nn.functional.normalize(torch.randn(16, 3, 8), dim=-1)
    mask = torch.ones(16, 3, dtype=torch.bool)
    s = m.formula(img, txt, refs, mask)
    cos = (img * txt).sum(-1)
    if not m.clamp:
        assert torch.equal(s, cos) and (cos < 0).any()  # negative cosines stay negative
        return
    assert s.shape == (16,) and (s >= 0).all() and (s <= m.w + 1e-6).all()
    opposite = m.formula(img, -img, -img.unsqueeze(1), torch.ones(16, 1, dtype=torch.bool))
    assert torch.equal(opposite, torch.zeros(16))
    if not m.refs:
        assert torch.allclose(s, m.w * cos.clamp(min=0))


@pytest.fixture(scope="module")
def metric_weights(tmp_path_factory):
    """Polos and DENEB checkpoints in the released layouts (random tensors), for the metrics with own models."""
    from learned_weights import weights_dir

    return weights_dir(tmp_path_factory.mktemp("metric-weights"), polos=True, deneb=True)


@pytest.mark.parametrize("name", [metric_case(n) for n in metric_names("image")
                                  if n not in ("fleur", "reffleur", "expert")])  # tests/test_learned_faces.py
def test_every_image_metric_through_score_batch(name, images, tiny_backbone, metric_weights, monkeypatch):
    """The tensor-level core (score_batch), capscore.score and, for a reference-free metric, its pair
    scorer (what the probes call) give the same numbers and columns for every registered image metric."""
    import capscore
    from capscore.meta.reproduce import missing_tools
    from capscore.scores.pairs import get_pair_scorer, pair_scorer_names

    if missing_tools(name):  # the classic metrics: pycocoevalcap, Java, CoreNLP (SPICE)
        pytest.skip(missing_tools(name))
    monkeypatch.setenv("CAPSCORE_METRIC_WEIGHTS", str(metric_weights))  # polos, deneb: the documented default
    caps = ["a red cube left of a blue circle", "a dog", "two green cubes"]
    refs = [["a red cube", "a blue circle"], ["a dog on grass"], ["green cubes", "two cubes"]]
    enc = Encoder(tiny_backbone)
    got = _quiet(capscore.score_batch, enc, name, images, caps, refs)
    frame = _quiet(capscore.score, images, caps, refs, model=tiny_backbone, metric=name, as_frame=True)
    np.testing.assert_allclose(got.scores, frame["score"].to_numpy(float), atol=1e-6)
    assert set(got.parts) == set(METRICS[name].columns("image"))
    for column, values in got.parts.items():
        if all(isinstance(v, str) for v in values):  # a classic metric's per-item statistics ("stats")
            assert list(frame[column]) == values
        else:
            np.testing.assert_allclose(values, frame[column].to_numpy(float), atol=1e-6)
    if name in pair_scorer_names():
        pairs = get_pair_scorer(name)(Encoder(tiny_backbone), images, caps)
        np.testing.assert_allclose(pairs.numpy(), got.scores, atol=1e-6)
    else:
        assert METRICS[name].needs_refs  # only a reference-based metric has no pair form
