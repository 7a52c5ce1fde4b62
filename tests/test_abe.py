"""ABE-CLIP: each step on hand-made vectors, pair extraction, spans, and the full pipeline recomputed by hand.

Expected values come from hand arithmetic or from the encoding engine's raw features
combined in the test itself — never from the functions under test.
"""
from __future__ import annotations

import math

import open_clip
import pytest
import torch
from PIL import Image

from capscore.embed import Encoder
from capscore.errors import CapscoreError
from capscore.scores import abe
from capscore.scores.abe import (
    AbeConfig,
    Binding,
    Word,
    abe_components,
    abe_scores,
    binding_difference,
    binding_vector,
    extract_pairs,
    fuse,
    local_alignment,
    make_abe_scorer,
    refine_tokens,
    topk_pool,
    word_token_span,
)
from capscore.scores.concepts import load_concept_pool, nearest_concepts, parse_pool
from capscore.scores.pairs import cosine_pairs, get_pair_scorer

R2 = math.sqrt(2)


# ---------------------------------------------------------------- step 1: local alignment
def test_topk_pool_by_hand():
    sim = torch.tensor([[0.9, 0.1, 0.5, 0.3], [-0.2, 0.4, 0.0, 0.8]])
    assert torch.allclose(topk_pool(sim, k=2), torch.tensor([0.7, 0.6]))  # (0.9+0.5)/2, (0.8+0.4)/2
    assert torch.allclose(topk_pool(sim, k=1), torch.tensor([0.9, 0.8]))
    assert torch.allclose(topk_pool(sim, k=10), torch.tensor([0.45, 0.25]))  # K capped at N=4: plain mean


def test_local_alignment_by_hand():
    e = torch.eye(3)
    tokens = torch.stack([e[0], (e[0] + e[1]) / R2])  # S = [[1, 0, 0], [1/√2, 1/√2, 0]]
    patches = 2.0 * e  # not normalised on purpose: cosine re-normalises
    assert local_alignment(tokens, patches, k=1).item() == pytest.approx((1 + 1 / R2) / 2)
    assert local_alignment(tokens, patches, k=2).item() == pytest.approx((0.5 + 1 / R2) / 2)


# ---------------------------------------------------------------- step 2: refinement
def test_binding_vector_by_hand():
    with_attr = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    bare = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    assert torch.allclose(binding_vector(with_attr, bare), torch.tensor([1.5, 2.0]))  # mean of (1,1), (2,3)


def test_refine_tokens_by_hand():
    e = torch.eye(3)
    tokens = torch.stack([e[0], e[1], e[2]])  # attribute, object, unrelated word
    b = Binding(object_span=(1, 2), attribute_spans=((0, 1),), b_plus=e[2].clone(), b_minus=e[0].clone())
    got = refine_tokens(tokens, [b])
    assert torch.allclose(got[0], torch.tensor([1.0, 1.0, 0.0]) / R2)  # t_a + t_k
    assert torch.allclose(got[1], torch.tensor([-1.0, 1.0, 1.0]) / math.sqrt(3))  # t_k + b⁺ − b⁻
    assert torch.allclose(got[2], e[2])  # untouched
    no_neg = refine_tokens(tokens, [b], negative_binding=False)
    assert torch.allclose(no_neg[1], torch.tensor([0.0, 1.0, 1.0]) / R2)


def test_refine_tokens_multi_token_object():
    e = torch.eye(4)
    tokens = torch.stack([e[0], e[1], e[2], e[3]])  # attribute; object spans tokens 1-2
    b = Binding(object_span=(1, 3), attribute_spans=((0, 1),), b_plus=e[3].clone(), b_minus=torch.zeros(4))
    got = refine_tokens(tokens, [b])
    # attribute gets the mean of the object's span: e0 + (e1 + e2)/2 = (1, .5, .5, 0)
    assert torch.allclose(got[0], torch.tensor([1.0, 0.5, 0.5, 0.0]) / math.sqrt(1.5))
    # b⁺ goes to every token of the span
    assert torch.allclose(got[1], torch.tensor([0.0, 1.0, 0.0, 1.0]) / R2)
    assert torch.allclose(got[2], torch.tensor([0.0, 0.0, 1.0, 1.0]) / R2)
    assert torch.allclose(got[3], e[3])


# ---------------------------------------------------------------- steps 3-4
def test_binding_difference_and_fusion_by_hand():
    s_ref = torch.tensor([0.30, 0.20])
    s_base = torch.tensor([0.25, 0.25])
    assert torch.allclose(binding_difference(s_ref, s_base), torch.tensor([0.35, 0.25]))  # .30+.05, .20+.05
    assert fuse(torch.tensor(0.4), torch.tensor(0.1), omega=0.3).item() == pytest.approx(0.31)  # .7*.4 + .3*.1
    assert fuse(torch.tensor(0.4), torch.tensor(0.1), omega=0.0).item() == pytest.approx(0.4)


# ---------------------------------------------------------------- pairs and spans
def _as_tuples(pairs):
    return [(a.text, po.object.text) for po in pairs for a in po.attributes]


def test_pairs_on_the_papers_examples():
    """abe-clip.txt parses with Stanza; capscore with spaCy. The paper's own sentences: Fig. 1 (a) positive
    and negative ("A green scooter is parked near a curb in front of a blue vintage car"), Fig. 3 ("A yellow
    cylinder and a red cube."), and section 4.1.1's ARO-A template "the A1 O1 and the A2 O2"."""
    got = extract_pairs([
        "A blue scooter is parked near a curb in front of a green vintage car",
        "A yellow cylinder and a red cube",
        "a red and blue car",
        "the small metal sphere",
    ])
    neg, fig3, aro = extract_pairs([
        "A green scooter is parked near a curb in front of a blue vintage car",
        "A yellow cylinder and a red cube.",
        "the white horse and the brown dog",
    ])
    assert _as_tuples(neg) == [("green", "scooter"), ("blue", "car"), ("vintage", "car")]
    assert _as_tuples(fig3) == [("yellow", "cylinder"), ("red", "cube")]
    assert _as_tuples(aro) == [("white", "horse"), ("brown", "dog")]
    assert _as_tuples(got[0]) == [("blue", "scooter"), ("green", "car"), ("vintage", "car")]
    assert _as_tuples(got[1]) == [("yellow", "cylinder"), ("red", "cube")]
    assert _as_tuples(got[2]) == [("red", "car"), ("blue", "car")]  # conjoined adjectives
    assert _as_tuples(got[3]) == [("small", "sphere"), ("metal", "sphere")]  # amod + compound
    car = got[0][1].object
    assert (car.start, car.end) == (65, 68)


def test_word_spans_follow_bpe(tiny_backbone):
    text = "A blue scooter is parked near a curb in front of a green vintage car"
    # CLIP BPE (read off the tokenizer): <sot> a blue scoo ter is parked near a curb in front of a green vintage car <eot>
    tok = lambda s: tiny_backbone.tokenize([s])[0]  # noqa: E731
    assert word_token_span(tok, text, Word("blue", 2, 6), n_special=2) == (2, 3)
    assert word_token_span(tok, text, Word("scooter", 7, 14), n_special=2) == (3, 5)  # two BPE tokens
    assert word_token_span(tok, text, Word("car", 65, 68), n_special=2) == (16, 17)
    assert tiny_backbone.token_strings(tiny_backbone.tokenize([text])[0])[3:5] == ["scoo", "ter"]


# ---------------------------------------------------------------- concept pool
def test_concept_pool_parsing_and_neighbours(tmp_path):
    pool = parse_pool("# comment\nCube\n\nsphere  # trailing\ncube\n", source="x.txt")
    assert pool.words == ("cube", "sphere")
    # SPLiCE's vocabulary files (one concept per line) read unchanged: a '#' glued to a word is not a comment
    assert parse_pool("...#\nmotorbike\n?#\n", source="laion.txt").words == ("...#", "motorbike", "?#")
    with pytest.raises(CapscoreError, match="x.txt.*empty"):
        parse_pool("# nothing\n", source="x.txt")
    assert len(load_concept_pool()) > 200 and "cube" in load_concept_pool().words
    with pytest.raises(CapscoreError, match="not found"):
        load_concept_pool(tmp_path / "missing.txt")
    q = torch.tensor([[1.0, 0.0]])
    pv = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [R2 / 2, R2 / 2]])
    assert nearest_concepts(q, pv, p=3).tolist() == [[1, 2, 3]]  # tie 1 vs 2 -> file order


# ---------------------------------------------------------------- the whole pipeline, recomputed by hand
def _topk_mean_by_sorting(tokens, patches, k):
    sims = torch.nn.functional.normalize(tokens, dim=-1) @ patches.T
    return sims.sort(dim=1, descending=True).values[:, :k].mean(1).mean()


def test_full_pipeline_matches_hand_recomputation(tiny_backbone, make_images, tmp_path):
    pool_file = tmp_path / "pool.txt"
    pool_file.write_text("ball\nbox\n")  # P = 2 = the whole pool: no ranking involved
    cfg = AbeConfig(p=2, pool=str(pool_file))
    img = make_images(1)[0]
    cap = "a yellow cylinder and a red cube"  # <sot> a yellow cylinder and a red cube <eot>
    enc = Encoder(tiny_backbone)
    got = abe_components(enc, [img], [cap], config=cfg)

    raw = Encoder(tiny_backbone)  # a separate engine: only raw features from here on
    v_cls, patches = raw.image_patches([img])
    f = raw.text_tokens([cap])[0]
    t = f.vectors
    assert f.tokens[2:4] == ("yellow", "cylinder") and f.tokens[6:8] == ("red", "cube")

    def F(phrase):  # final-layer vector of the last word (one BPE token: ball / box)
        return raw.text_tokens([phrase])[0].vectors[-2]

    def b(attr):
        return sum(F(f"{attr} {o}") - F(o) for o in ("ball", "box")) / 2

    refined = t.clone()
    refined[3] = t[3] + b("yellow") - b("red")  # cylinder
    refined[7] = t[7] + b("red") - b("yellow")  # cube
    refined[2] = t[2] + t[3]  # yellow + cylinder
    refined[6] = t[6] + t[7]  # red + cube
    s_base = _topk_mean_by_sorting(t[1:-1], patches[0], 5)
    s_ref = _topk_mean_by_sorting(refined[1:-1], patches[0], 5)
    s_local = s_ref + abs(s_ref - s_base)
    s_global = v_cls[0] @ f.global_
    expected = 0.7 * s_local + 0.3 * s_global
    assert got.base.item() == pytest.approx(s_base.item(), abs=1e-6)
    assert got.refine.item() == pytest.approx(s_ref.item(), abs=1e-6)
    assert got.global_.item() == pytest.approx(s_global.item(), abs=1e-6)
    assert got.final.item() == pytest.approx(expected.item(), abs=1e-6)
    assert got.refine.item() != pytest.approx(got.base.item(), abs=1e-4)  # refinement did something


def test_ablation_switches(tiny_backbone, make_images):
    imgs = make_images(2)
    caps = ["a yellow cylinder and a red cube", "a green vintage car"]
    enc = Encoder(tiny_backbone)
    glob = cosine_pairs(enc, imgs, caps).float()  # pair scorers return float64
    assert torch.allclose(make_abe_scorer(omega=1.0)(enc, imgs, caps), glob, atol=1e-6)
    local = abe_components(enc, imgs, caps, config=AbeConfig(refine=False))
    assert torch.allclose(local.final, 0.7 * local.base + 0.3 * glob, atol=1e-6)
    no_bd = abe_components(enc, imgs, caps, config=AbeConfig(binding_difference=False))
    assert torch.allclose(no_bd.local, no_bd.refine)
    full = abe_components(enc, imgs, caps)
    assert torch.allclose(full.local, full.refine + (full.refine - full.base).abs())
    assert torch.allclose(full.base, local.base)


def test_k_sweep_equals_one_run_per_k(tiny_backbone, make_images):
    from capscore.scores.abe import abe_k_sweep

    imgs = make_images(2)
    caps = ["a yellow cylinder and a red cube", "a green vintage car"]
    enc = Encoder(tiny_backbone)
    sweep = abe_k_sweep(enc, imgs, caps, (1, 3, 10), config=AbeConfig(k=5))
    assert sorted(sweep) == [1, 3, 10]
    for k, got in sweep.items():
        want = abe_components(enc, imgs, caps, config=AbeConfig(k=k))
        assert got.config.k == k
        for part in ("base", "refine", "local", "global_", "final"):
            assert torch.allclose(getattr(got, part), getattr(want, part), atol=1e-6)
    assert not torch.allclose(sweep[1].base, sweep[10].base)  # K matters on these images


def test_deterministic_and_batched_equals_one_at_a_time(tiny_backbone, make_images):
    imgs = make_images(3)
    pairs = [(imgs[0], "a yellow cylinder and a red cube"), (imgs[1], "A blue scooter near a green vintage car"),
             (imgs[0], "a red cylinder and a yellow cube"), (imgs[2], "a dog")]
    scorer = get_pair_scorer("abe")
    batched = scorer(Encoder(tiny_backbone, batch_size=3), [p[0] for p in pairs], [p[1] for p in pairs])
    again = scorer(Encoder(tiny_backbone, batch_size=3), [p[0] for p in pairs], [p[1] for p in pairs])
    one = Encoder(tiny_backbone)  # its own engine: each caption and image is encoded alone
    single = torch.cat([scorer(one, [im], [c]) for im, c in pairs])
    assert torch.equal(batched, again)
    assert torch.allclose(batched, single, atol=1e-6, rtol=0)
    assert batched.shape == (4,) and torch.isfinite(batched).all()


# ---------------------------------------------------------------- errors and options
def test_backbone_without_patch_tokens_gives_clear_error(tmp_path, make_images):
    from capscore.backbones import load_backbone

    cfg = tmp_path / "capscore-test-tiny-rn.json"  # a real ResNet CLIP: no patch tokens in the joint space
    cfg.write_text('{"embed_dim": 32, "quick_gelu": true, "vision_cfg": {"image_size": 32, "layers": [1, 1, 1, 1],'
                   ' "width": 8}, "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32,'
                   ' "heads": 2, "layers": 2}}')
    open_clip.add_model_config(cfg)
    with pytest.warns(Warning):
        bb = load_backbone("capscore-test-tiny-rn")
    with pytest.raises(CapscoreError, match=r"ABE-CLIP needs patch tokens.*capscore-test-tiny-rn") as e:
        abe_scores(Encoder(bb), make_images(1), ["a red cube"])
    assert "\n" not in str(e.value)


def test_option_and_input_errors(tiny_backbone, make_images):
    with pytest.raises(CapscoreError, match="did you mean 'omega'"):
        make_abe_scorer(omeg=0.3)
    with pytest.raises(CapscoreError, match="'k' parameter of AbeConfig must be an int >= 1; got 0"):
        AbeConfig(k=0)
    with pytest.raises(CapscoreError, match="omega"):
        AbeConfig(omega=1.5)
    with pytest.raises(CapscoreError, match="did you mean 'full'"):
        make_abe_scorer(ablation="ful")
    with pytest.raises(CapscoreError, match="did you mean 'omega'"):
        get_pair_scorer("abe", omeg=0.3)  # checked when the scorer is made, before any pair is scored
    enc = Encoder(tiny_backbone)
    img = make_images(1)
    local = AbeConfig(k=3, refine=False, binding_difference=False)  # the "local" preset with K = 3
    got = get_pair_scorer("abe", k=3, ablation="local")(enc, img, ["a yellow cylinder and a red cube"])
    assert got.tolist() == pytest.approx(abe_scores(enc, img, ["a yellow cylinder and a red cube"],
                                                    config=local).tolist(), abs=1e-7)
    with pytest.raises(CapscoreError, match="1 images and 2 texts"):
        abe_scores(enc, img, ["a", "b"])
    with pytest.raises(CapscoreError, match="text #0: empty caption"):
        abe_scores(enc, img, ["  "])


# ---------------------------------------------------------------- explain
def test_explain_writes_png_and_names_bad_word(tmp_path, make_images, capsys):
    from capscore.cli import main

    img = make_images(1, size=48)[0]
    out = tmp_path / "heat.png"
    argv = ["-q", "explain", "--model", "capscore-test-tiny", "--image", str(img),
            "--caption", "A blue scooter and a green car", "--word", "scooter", "--out", str(out), "--refined"]
    assert main(argv) == 0
    assert Image.open(out).format == "PNG"
    assert "['scoo', 'ter']" in capsys.readouterr().out
    argv[argv.index("scooter")] = "scoter"
    assert main(argv) == 2
    assert "did you mean 'scooter'" in capsys.readouterr().err


def test_heatmap_grid_is_the_words_patch_cosines(tiny_backbone, make_images):
    img = make_images(1)[0]
    enc = Encoder(tiny_backbone)
    h = abe.word_heatmap(enc, img, "a red cube", "cube")
    _, patches = enc.image_patches([img])
    f = enc.text_tokens(["a red cube"])[0]
    expected = (patches[0] @ f.vectors[3]).reshape(4, 4)  # <sot> a red cube <eot>: cube is position 3
    assert torch.allclose(h.grid, expected, atol=1e-6)
    assert set(h.topk) == set(expected.flatten().argsort(descending=True)[:5].tolist())
