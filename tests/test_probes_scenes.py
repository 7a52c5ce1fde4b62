"""Scene suites: exact labels from capscore.scenes (skipped with a reason until it is importable)."""
import types

import pytest

scenes = pytest.importorskip("capscore.scenes", reason="capscore.scenes (synthetic scenes) not available yet")


def _args(**kw):
    base = dict(n_scenes=4, seed=0, kinds="masking,substitution", p=0.4, mask="[MASK]")
    return types.SimpleNamespace(**{**base, **kw})


def test_scene_specificity_wrong_units_are_exactly_false():
    from capscore.probes.scenes import specificity_inputs
    from capscore.scenes import Caption, generate_scenes
    from capscore.scenes import captions as C

    sc = generate_scenes(4, seed=0, split="heldout")
    items, units = specificity_inputs(sc)
    for s, it, us in zip(sc, items, units):
        assert us == [Caption((u,)).text for u in C.detail_units(s)]
        assert it.wrong_units is not None and len(it.wrong_units) == len(us) - 1
        # every unit realised from another scene's claims: none of its facts are true here
        truth = scenes.truth(s)
        for w in set(it.wrong_units):
            src = next(u for o in sc if o is not s for u in C.detail_units(o) if Caption((u,)).text == w)
            assert not (src.facts() & truth)


def test_scene_flip_items_differ_from_truth():
    from capscore.probes.scenes import flip_items
    from capscore.scenes import generate_scenes

    items = flip_items(generate_scenes(3, seed=1, split="heldout"))
    assert items and all(it.captions[0] != it.captions[1] for it in items)
    assert {it.subset for it in items} <= set(scenes.ERROR_KINDS)


def test_scene_suites_run_with_tiny_model(tiny_backbone):
    from capscore.embed.engine import Encoder
    from capscore.probes.scenes import SCENE_SUITES

    enc = Encoder(tiny_backbone, batch_size=32)
    res = SCENE_SUITES["scenes-specificity"](enc, args=_args())
    s = res.summary[0]
    assert s["n_images"] == 4 and 0.0 <= s["sr_pos"] <= 1.0 and 0.0 <= s["sr_neg"] <= 1.0
    res = SCENE_SUITES["scenes-perturb"](enc, args=_args())
    assert {r["kind"] for r in res.summary} == {"masking", "substitution", "average"}


def test_scenes_tiny_lgip_color_flips_and_specificity():
    pytest.importorskip("capscore.scenes.tiny", reason="bundled scenes-tiny model not available yet")
    from capscore.backbones import load_backbone
    from capscore.embed.engine import Encoder
    from capscore.probes.scenes import SCENE_SUITES

    enc = Encoder(load_backbone("scenes-tiny"), batch_size=64)
    res = SCENE_SUITES["scenes-lgip"](enc, args=_args(n_scenes=32))
    color = next(s for s in res.summary if s["flip_type"] == "color")
    assert color["positive_rate"] > 0.7
    spec = SCENE_SUITES["scenes-specificity"](enc, args=_args(n_scenes=16)).summary[0]
    assert spec["sr_neg"] > 0.5


def test_scenes_lgip_has_count_flips(tiny_backbone):
    """LGIP Table 2's count column has its scenes counterpart: number words flipped to another number word."""
    import re

    from capscore.embed.engine import Encoder
    from capscore.probes.scenes import SCENE_SUITES

    numbers = ["two", "three", "four", "five", "six"]  # counts the short captions write as words (2..6 objects)
    res = SCENE_SUITES["scenes-lgip"](Encoder(tiny_backbone, batch_size=32), args=_args(n_scenes=24))
    count = next(s for s in res.summary if s["flip_type"] == "count")
    flips = [(r["caption"], f) for r in res.rows for f in r["flips"] if f["type"] == "count"]
    assert count["n_flips"] == len(flips) > 0
    for caption, f in flips:
        assert f["old"] in numbers and f["new"] in numbers and f["old"] != f["new"]
        m = re.search(rf"\b{f['old']}\b", caption)  # the first count word is the one flipped
        assert f["text"] == caption[: m.start()] + f["new"] + caption[m.end():]
    # captions that carry a count word all get a count flip
    with_count = [r for r in res.rows if any(re.search(rf"\b{w}\b", r["caption"]) for w in numbers)]
    assert len(with_count) == len(flips)
