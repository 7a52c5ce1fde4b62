"""The bundled scenes-tiny model: loads through the registry, stable identity, and the numbers its
model card claims (re-measured here on the same fixed seed)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

import capscore.scenes
from capscore.backbones import load_backbone
from capscore.embed.engine import Encoder

WEIGHTS_DIR = Path(capscore.scenes.__file__).parent / "weights"
TOLERANCE = 0.02


@pytest.fixture(scope="module")
def bb():
    return load_backbone("scenes-tiny")


@pytest.fixture(scope="module")
def claims():
    return json.loads((WEIGHTS_DIR / "scenes-tiny.json").read_text())


def test_loads_through_registry_with_stable_identity(bb):
    again = load_backbone("scenes-tiny")
    assert bb.identity == again.identity and bb.identity.startswith("open_clip:scenes-tiny|w=")
    assert bb.context_length == 77 and bb.has_patch_tokens and bb.has_token_features
    weights = WEIGHTS_DIR / "scenes-tiny.safetensors"
    assert weights.stat().st_size <= 20e6
    a = Encoder(bb).encode_texts(["A picture of a red circle."])
    b = Encoder(again).encode_texts(["A picture of a red circle."])
    assert torch.equal(a, b)
    img = capscore.scenes.generate_scenes(1, seed=0, size=96)[0].render()
    g, p = Encoder(bb).image_patches([img])
    assert p.shape == (1, 144, bb.embed_dim)  # v3: 96 px, a stride-8 convolutional stem = 12 x 12 patches


def test_at_most_two_model_files_ship_and_v1_names_its_recipe(bb):
    """The wheel ships scenes-tiny and scenes-tiny-v4 only; scenes-tiny-v1 is rebuilt by its recipe, and its
    name says so in one line instead of loading anything (not even its random-init architecture)."""
    from capscore.backbones.registry import BUNDLED, PURPOSE
    from capscore.errors import CapscoreError
    from capscore.scenes.tiny import BUNDLED_FILES, weights_arch

    shipped = sorted(p.name for p in WEIGHTS_DIR.iterdir() if p.suffix == ".safetensors")
    assert shipped == ["scenes-tiny-v4.safetensors", "scenes-tiny.safetensors"]
    assert sorted(BUNDLED) == sorted(BUNDLED_FILES) == sorted(PURPOSE) == ["scenes-tiny", "scenes-tiny-v4"]
    assert weights_arch(BUNDLED_FILES["scenes-tiny"]) == "scenes-tiny-v3"
    with pytest.raises(CapscoreError, match=r"^scenes-tiny-v1 is no longer shipped .* recipe .*"
                                            r"--model openclip:scenes-tiny-v1/DIR/scenes-tiny\.safetensors$"):
        load_backbone("scenes-tiny-v1")


def _check_claims(bb, claimed: dict) -> None:
    from capscore.scenes.evaluate import evaluate_scenes

    got = evaluate_scenes(bb, n=claimed["params"]["n"], seed=claimed["params"]["seed"])
    for part in ("seen", "unseen"):
        for key in ("i2t_r1", "t2i_r1"):
            assert abs(got[part][key] - claimed[part][key]) <= TOLERANCE, (part, key)
        for kind, c in claimed[part]["flips"].items():
            g = got[part]["flips"][kind]
            assert g["n"] == c["n"] and abs(g["accuracy"] - c["accuracy"]) <= TOLERANCE, (part, kind, g, c)


@pytest.mark.slow  # re-measures the model card's claims
def test_claimed_rates_reproduce_on_the_fixed_seed(bb, claims):
    _check_claims(bb, claims["evaluation"])


@pytest.mark.slow  # re-measures the model card's claims
def test_v4_is_v3_with_a_second_order_readout_and_its_claims_hold(bb):
    """scenes-tiny-v4 (capscore.backbones.readout): v3's towers, a 128²-number global vector, patch and word
    tokens still 128-d; the model card's numbers re-measured on the same fixed seed."""
    from capscore.scenes.tiny import BUNDLED_FILES, weights_arch

    v4 = load_backbone("scenes-tiny-v4")
    assert weights_arch(BUNDLED_FILES["scenes-tiny-v4"]) == "scenes-tiny-v4"
    assert BUNDLED_FILES["scenes-tiny-v4"].stat().st_size <= 20e6
    assert (v4.readout, v4.embed_dim, v4.token_dim, bb.readout) == ("second-order", 128 * 128, 128, "class")
    assert v4.identity.startswith("open_clip:scenes-tiny-v4|w=") and v4.identity.endswith("|readout=second-order")
    assert [k for k, _ in v4.model.named_parameters()] == [k for k, _ in bb.model.named_parameters()]
    report = json.loads((WEIGHTS_DIR / "scenes-tiny-v4.json").read_text())
    assert report["arch"] == "scenes-tiny-v4"
    claimed = report["evaluation"]
    assert claimed["params"]["n"] == 500  # issue 11's protocol: capscore scenes eval --n 500
    for part in ("seen", "unseen"):  # issue 11's targets, as the model card states them met
        flips = claimed[part]["flips"]
        assert min(flips[k]["accuracy"] for k in ("color", "shape", "count", "hallucination")) >= (0.95 if part == "seen" else 0.9)
        assert min(claimed[part]["i2t_r1"], claimed[part]["t2i_r1"]) >= 0.6
    _check_claims(v4, claimed)


@pytest.mark.slow  # re-measures the model card's claims
def test_flip_wins_recomputed_with_plain_open_clip(bb, claims):
    """Independent path: open_clip's own tokenizer (padded to 77) and encode_* on the raw model."""
    from capscore.scenes import applicable_errors, generate_scenes, make_flaw

    scenes = generate_scenes(60, seed=4321, split="train", size=96)
    items = [(s, make_flaw(s, "color", np.random.default_rng([4321, s.index]))) for s in scenes
             if "color" in applicable_errors(s)]
    tok = open_clip.get_tokenizer("scenes-tiny-v3")
    model = bb.model
    with torch.no_grad():
        img = F.normalize(model.encode_image(torch.stack([bb.preprocess(s.render()) for s, _ in items])), dim=-1)
        good = F.normalize(model.encode_text(tok([f.correct for _, f in items])), dim=-1)
        bad = F.normalize(model.encode_text(tok([f.flawed for _, f in items])), dim=-1)
    ref = ((img * good).sum(1) > (img * bad).sum(1)).numpy()
    enc = Encoder(bb)
    e_img = enc.encode_images([s.render() for s, _ in items])
    ours = ((e_img * enc.encode_texts([f.correct for _, f in items])).sum(1)
            > (e_img * enc.encode_texts([f.flawed for _, f in items])).sum(1)).numpy()
    assert (ref == ours).mean() >= 0.97  # same decisions through the engine (pad-to-longest, cache)
    # another sample of seen-combination colour flips (about 55 items): within sampling noise of the claim
    claimed = claims["evaluation"]["seen"]["flips"]["color"]["accuracy"]
    assert abs(ref.mean() - claimed) <= 0.1, (ref.mean(), claimed)


@pytest.mark.slow  # re-measures the model card's claims
def test_blind_accuracy_is_the_empty_scene_recomputed_with_plain_open_clip(bb):
    """``scenes eval``'s blind column: both captions against an empty scene (text priors only)."""
    from capscore.scenes import generate_scenes
    from capscore.scenes.evaluate import EVAL_SEED, evaluate_scenes, flip_items
    from capscore.scenes.graph import render_objects

    res = evaluate_scenes(bb, n=40)
    got = res["seen"]["flips"]
    items = flip_items(generate_scenes(40, seed=EVAL_SEED, split="train", size=96), seed=EVAL_SEED)
    tok = open_clip.get_tokenizer("scenes-tiny-v3")
    with torch.no_grad():
        empty = F.normalize(bb.model.encode_image(bb.preprocess(render_objects((), 96))[None]), dim=-1)
        good = F.normalize(bb.model.encode_text(tok([it["correct"] for it in items])), dim=-1)
        bad = F.normalize(bb.model.encode_text(tok([it["flawed"] for it in items])), dim=-1)
    wins = ((empty * good).sum(1) > (empty * bad).sum(1)).numpy()
    for kind, row in got.items():
        ref = wins[[k for k, it in enumerate(items) if it["kind"] == kind]]
        assert row["n"] == len(ref) and abs(row["blind"] - ref.mean()) <= 0.05, (kind, row, ref.mean())
    assert got["count"]["blind"] > 0.6  # scenes-tiny's count flips are mostly won by text priors (docs/scenes.md)
    # paired: the scene prefers the correct caption AND its counterfactual twin prefers the flawed one
    from capscore.scenes.graph import counterfactual

    by_id = {s.id: s for s in generate_scenes(40, seed=EVAL_SEED, split="train", size=96)}
    with torch.no_grad():
        own = F.normalize(bb.model.encode_image(torch.stack([bb.preprocess(by_id[it["scene"]].render())
                                                             for it in items])), dim=-1)
    for kind in ("color", "shape", "count"):
        ks = [k for k, it in enumerate(items) if it["kind"] == kind]
        twins = {k: counterfactual(by_id[items[k]["scene"]], items[k]["flaw"]) for k in ks}
        ks = [k for k in ks if twins[k] is not None]
        with torch.no_grad():
            tw = F.normalize(bb.model.encode_image(torch.stack([bb.preprocess(twins[k].render()) for k in ks])), dim=-1)
        first = ((own[ks] * good[ks]).sum(1) > (own[ks] * bad[ks]).sum(1)).numpy()
        second = ((tw * bad[ks]).sum(1) > (tw * good[ks]).sum(1)).numpy()
        row = got[kind]
        assert row["n_paired"] == len(ks) and abs(row["paired"] - (first & second).mean()) <= 0.05, (kind, row)
        assert row["paired"] <= row["accuracy"]
    # by_objects: the same wins, grouped by the number of objects in the scene
    own_wins = ((own * good).sum(1) > (own * bad).sum(1)).numpy()
    for kind, row in got.items():
        assert sum(c["n"] for c in row["by_objects"].values()) == row["n"]
        off = 0.0
        for c, cell in row["by_objects"].items():
            ref = own_wins[[k for k, it in enumerate(items)
                            if it["kind"] == kind and len(by_id[it["scene"]].graph.objects) == int(c)]]
            assert cell["n"] == len(ref)
            off += abs(cell["accuracy"] * cell["n"] - ref.sum())
        assert off <= 1, (kind, row["by_objects"])  # at most one near-tie decided differently
    # by_binding: the same wins split by whether the error's new value is elsewhere in the scene, decided
    # here from the flaw's human-readable detail ("red circle: circle -> star", "+ small red star", ...)
    def bound(it) -> bool:
        scene = by_id[it["scene"]]
        shapes, colours = {o.shape for o in scene.objects}, {o.color for o in scene.objects}
        if it["kind"] == "hallucination":
            _, _size, colour, shape = it["detail"].split()
            return shape in shapes and colour in colours
        group, change = it["detail"].split(": ")
        new = change.split(" -> ")[1]
        if it["kind"] == "count":
            return int(new) in [g.count for g in scene.graph.groups if f"{g.color} {g.shape}" != group]
        return new in (colours if it["kind"] == "color" else shapes)

    n_bound = 0
    for kind in ("color", "shape", "count", "hallucination"):
        ks = [k for k, it in enumerate(items) if it["kind"] == kind]
        split = got[kind]["by_binding"]
        for name, want in (("free", False), ("bound", True)):
            ref = own_wins[[k for k in ks if bound(items[k]) == want]]
            assert split[name]["n"] == len(ref), (kind, name, split)
            if len(ref):
                assert abs(split[name]["accuracy"] * len(ref) - ref.sum()) <= 1, (kind, name, split)
        n_bound += split["bound"]["n"]
    assert n_bound > 0 and "by_binding" not in got["attribute_swap"]
    from capscore.scenes.evaluate import format_report

    assert "bound" in format_report(res, by_binding=True) and "bound" not in format_report(res)
    text = format_report(res, by_objects=True)
    assert "seen: accuracy by objects in the scene" in text and "unseen: accuracy by objects" in text
    assert "by objects" not in format_report(res)
