"""experiments/scenes_binding.py: its global column is `scenes eval`'s accuracy, its local column ABE's
local score, and its retrieval part `scenes eval`'s R@1 — recomputed here by other paths."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location(
    "scenes_binding", Path(__file__).parents[1] / "experiments" / "scenes_binding.py")
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


@pytest.mark.slow  # re-measures the binding benchmark
def test_scenes_binding_agrees_with_scenes_eval_and_abe(tmp_path):
    from capscore.backbones import load_backbone
    from capscore.scenes import generate_scenes
    from capscore.scenes.evaluate import EVAL_SEED, evaluate_scenes, flip_items

    out = tmp_path / "b.json"
    res = sb.main(["--model", "scenes-tiny", "--n", "30", "--n-retrieval", "30", "--probe", "400",
                   "--json", str(out)])
    assert json.loads(out.read_text())["retrieval"] == res["retrieval"]
    bb = load_backbone("scenes-tiny")
    ev = evaluate_scenes(bb, n=30)["seen"]
    for kind, row in res["global_vs_local"].items():
        flips = ev["flips"][kind]
        assert row["n"] == flips["n"]
        assert abs(row["all"]["global"] - flips["accuracy"]) * row["n"] <= 1, (kind, row["all"], flips)  # a near-tie at most
        assert sum(row["n_by_objects"].values()) == row["n"]
    assert res["retrieval"]["r1"] == ev["i2t_r1"]
    # the local column by hand: max over patches of each token's cosine (K = 1), mean over word tokens,
    # from open_clip's own towers (specials dropped as ABE does); shape items
    scenes = generate_scenes(30, seed=EVAL_SEED, split="train", size=96)
    by_id = {s.id: s for s in scenes}
    items = [it for it in flip_items(scenes, seed=EVAL_SEED) if it["kind"] == "shape"]
    px = torch.stack([bb.preprocess(by_id[it["scene"]].render()) for it in items])
    with torch.no_grad():
        _, patches = bb.forward_images(px, patches=True)

        def local(texts):
            ids = bb.tokenize(texts)
            out, pooled, second = [], [], []
            for i, r in enumerate(ids):
                _, tok = bb.forward_texts(torch.tensor([r]), torch.tensor([len(r)]), tokens=True)
                t = F.normalize(tok[0, 1:len(r) - 1], dim=-1)  # word tokens only
                p = F.normalize(patches[i], dim=-1)
                out.append((t @ p.T).max(1).values.mean())
                pooled.append(F.cosine_similarity(t.mean(0), p.mean(0), dim=0))
                # the outer-product matrices themselves, flattened (D * D numbers each)
                gt = torch.einsum("wi,wj->ij", t, t) / len(t)
                gp = torch.einsum("ni,nj->ij", p, p) / len(p)
                second.append(F.cosine_similarity(gt.flatten(), gp.flatten(), dim=0))
            return torch.stack(out), torch.stack(pooled), torch.stack(second)

        (good_l, good_m, good_s), (bad_l, bad_m, bad_s) = (local([it["correct"] for it in items]),
                                                           local([it["flawed"] for it in items]))
        wins, wins_mean, wins_second = (good_l > bad_l).numpy(), (good_m > bad_m).numpy(), (good_s > bad_s).numpy()
    row = res["global_vs_local"]["shape"]
    assert abs(row["all"]["local"] - wins.mean()) * len(items) <= 1
    assert abs(row["all"]["mean"] - wins_mean.mean()) * len(items) <= 1
    assert abs(row["all"]["second"] - wins_second.mean()) * len(items) <= 1
    # the free / bound split of the global column is scenes eval's --by-binding
    for kind in ("color", "shape", "count", "hallucination"):
        for part in ("free", "bound"):
            mine, theirs = res["global_vs_local"][kind]["by_binding"]["global"][part], ev["flips"][kind]["by_binding"][part]
            assert (mine is None) == (theirs["accuracy"] is None)
            if mine is not None:
                assert abs(mine - theirs["accuracy"]) * theirs["n"] <= 1, (kind, part)
    swap = res["closeness"]["attribute_swap"]
    assert swap["text"] > swap["text_random"] and -1 <= swap["margin"] <= 1
    assert 0 <= res["retrieval"]["misses_bag_consistent"] <= 1
    pr = res["probe"]
    assert pr["n_pairs"] >= 8 and 0 <= pr["cosine"] <= 1 and set(pr["image"]) == {"linear", "mlp"}


def test_second_order_cosine_is_the_cosine_of_the_outer_product_pools():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 16, generator=g), torch.randn(9, 16, generator=g)
    ga, gb = torch.einsum("wi,wj->ij", a, a) / 5, torch.einsum("ni,nj->ij", b, b) / 9
    assert torch.allclose(sb.second_order_cosine(a, b), F.cosine_similarity(ga.flatten(), gb.flatten(), dim=0))
    # it binds through locality where a mean does not: "red star" + "blue circle" against
    # "red circle" + "blue star", as one-hot features red, blue, star, circle summed within each token
    red, blue, star, circle = torch.eye(4)
    image = torch.stack([red + star, blue + circle])
    right, swapped = torch.stack([red + star, blue + circle]), torch.stack([red + circle, blue + star])
    assert torch.equal(right.mean(0), swapped.mean(0))  # the same bag
    assert sb.second_order_cosine(right, image) == pytest.approx(1.0)
    # by hand: every cross product is 1 and every token has norm² 2, so (1) / sqrt(2 * 2)
    assert sb.second_order_cosine(swapped, image) == pytest.approx(0.5)


@pytest.mark.slow  # re-measures the binding benchmark
def test_binding_probe_reads_conjunctions_and_not_bags():
    """Part 4: a swap pair has one bag of shapes and colours and opposite labels, so features that keep
    only the bag are read at exactly chance, features that code each (shape, colour) conjunction are read,
    and the cosine column compares each image with its own caption against its twin's."""
    from capscore.scenes import COLOR_NAMES, SHAPES

    pairs = sb.swap_pairs(700, seed=sb.PROBE_SEED, size=32)
    assert len(pairs) >= 100

    def objs(scene):
        return sorted((o.shape, o.color) for o in scene.objects)

    for p in pairs:  # two objects, colours swapped; the label by hand from the objects
        (s1, c1), (s2, c2) = objs(p["scene"])
        assert len(p["scene"].objects) == 2 and s1 != s2 and c1 != c2
        assert objs(p["twin"]) == sorted([(s1, c2), (s2, c1)])
        first_colour = min(((s1, c1), (s2, c2)))[1]  # colour of the alphabetically first shape
        assert p["label"] == int(first_colour == min(c1, c2))
    labels = torch.tensor([p["label"] for p in pairs] + [1 - p["label"] for p in pairs])
    scenes = [p["scene"] for p in pairs] + [p["twin"] for p in pairs]

    def bag(scene):
        v = torch.zeros(len(SHAPES) + len(COLOR_NAMES))
        for s, c in objs(scene):
            v[SHAPES.index(s)] += 1
            v[len(SHAPES) + COLOR_NAMES.index(c)] += 1
        return v

    def conj(scene):
        v = torch.zeros(len(SHAPES) * len(COLOR_NAMES))
        for s, c in objs(scene):
            v[SHAPES.index(s) * len(COLOR_NAMES) + COLOR_NAMES.index(c)] = 1
        return v / 2 ** 0.5

    b = torch.stack([bag(s) for s in scenes])
    r = sb.probe_features(b, b, labels)
    for tower in ("image", "text"):
        for probe in ("linear", "mlp"):
            assert r[tower][probe]["test"] == 0.5  # identical inputs, opposite labels: one right per pair
    assert r["cosine"] == 0.0  # own and twin's caption tie: never strictly preferred
    c = torch.stack([conj(s) for s in scenes])
    r = sb.probe_features(c, c, labels)
    assert r["cosine"] == 1.0  # cos 1 with its own caption, 0 with the twin's (no shared conjunction)
    for tower in ("image", "text"):
        assert r[tower]["mlp"]["test"] >= 0.8 and r[tower]["linear"]["test"] >= 0.75, r[tower]
    b_wide = torch.cat([b, torch.zeros(len(b), c.shape[1] - b.shape[1])], 1)  # one width for both towers
    mixed = sb.probe_features(c, b_wide, labels)  # the text side a bag: its probe at chance, the image's not
    assert mixed["text"]["mlp"]["test"] == 0.5 and mixed["image"]["mlp"]["test"] >= 0.8
