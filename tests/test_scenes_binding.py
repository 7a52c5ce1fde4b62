"""benchmarks/scenes_binding.py: its global column is `scenes eval`'s accuracy, its local column ABE's
local score, and its retrieval part `scenes eval`'s R@1 — recomputed here by other paths."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location(
    "scenes_binding", Path(__file__).parents[1] / "benchmarks" / "scenes_binding.py")
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


def test_scenes_binding_agrees_with_scenes_eval_and_abe(tmp_path):
    from capscore.backbones import load_backbone
    from capscore.scenes import generate_scenes
    from capscore.scenes.evaluate import EVAL_SEED, evaluate_scenes, flip_items

    out = tmp_path / "b.json"
    res = sb.main(["--model", "scenes-tiny", "--n", "30", "--n-retrieval", "30", "--json", str(out)])
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
            out = []
            for i, r in enumerate(ids):
                _, tok = bb.forward_texts(torch.tensor([r]), torch.tensor([len(r)]), tokens=True)
                t = F.normalize(tok[0, 1:len(r) - 1], dim=-1)  # word tokens only
                out.append((t @ F.normalize(patches[i], dim=-1).T).max(1).values.mean())
            return torch.stack(out)

        wins = (local([it["correct"] for it in items]) > local([it["flawed"] for it in items])).numpy()
    assert abs(res["global_vs_local"]["shape"]["all"]["local"] - wins.mean()) * len(items) <= 1
    swap = res["closeness"]["attribute_swap"]
    assert swap["text"] > swap["text_random"] and -1 <= swap["margin"] <= 1
    assert 0 <= res["retrieval"]["misses_bag_consistent"] <= 1
