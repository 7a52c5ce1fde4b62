"""Training defaults and data handling against the SPECS and PR-MCS papers (values from the paper text)."""
from __future__ import annotations

import json

import pytest

from capscore.errors import CapscoreError, InputError
from capscore.train.data import Example, read_jsonl, specs_units
from capscore.train.spec import TrainSpec
from capscore.train.recipes import (
    _given_perturbed,
    batch_languages,
    get_recipe,
    languages_of,
    specs_triplet,
)
from capscore.train.run import train_config


def _spec(recipe, **kw):
    return TrainSpec(recipe, get_recipe(recipe).defaults(), **kw)


def test_specs_optimiser_defaults_are_the_papers():
    # SPECS §4.3: lr 1e-5, weight decay 1e-2, batch 100 per GPU, accumulation over 4 steps (400 effective)
    o = train_config(_spec("specs"))
    assert (o.lr, o.weight_decay, o.batch_size, o.accum) == (1e-5, 1e-2, 100, 4)
    assert o.batch_size * o.accum == 400


def test_prmcs_optimiser_defaults_are_the_papers_and_overridable():
    # PR-MCS App. B.2: AdamW beta1 0.9, beta2 0.999, epsilon 1e-8, initial lr 5e-5
    o = train_config(_spec("prmcs"))
    assert (o.lr, o.betas, o.eps) == (5e-5, (0.9, 0.999), 1e-8)
    o = train_config(_spec("prmcs", **TrainSpec.parse_options("prmcs", {"betas": "0.8,0.95"}), eps=1e-6, lr=1e-4))
    assert (o.lr, o.betas, o.eps) == (1e-4, (0.8, 0.95), 1e-6)
    with pytest.raises(CapscoreError, match="The 'betas' parameter of recipe prmcs must be two floats"):
        TrainSpec.parse_options("prmcs", {"betas": "0.9"})
    with pytest.raises(CapscoreError, match="The 'accum' parameter of recipe specs must be a whole number in \\[1, 65,536\\]"):
        _spec("specs", accum=0)


class _Pick:
    def __init__(self, j):
        self.j = j

    def randrange(self, a, b):
        assert (a, b) == (1, 4)  # m = 4 units -> j in 1..3
        return self.j


def test_specs_triplet_from_detail_units_by_hand():
    e = Example(None, "u1 u2 u3 u4", units=("A cat", "on a mat", "with stripes", "near a door"))
    assert specs_triplet(e, _Pick(1)) == ("A cat", "on a mat")
    assert specs_triplet(e, _Pick(3)) == ("A cat on a mat with stripes", "near a door")
    given = Example(None, "x", base="a dog", detail="on grass")
    assert specs_triplet(given, None) == ("a dog", "on grass")  # data's own triplet wins


def test_specs_units_segments_captions_and_reports_the_unusable():
    ex = [Example(None, "A white cat with black spots is lying on a red couch.", source="t.jsonl:1"),
          Example(None, "A cat.", source="t.jsonl:2"),
          Example(None, "a b", base="a", detail="b", source="t.jsonl:3")]
    out, skipped = specs_units(ex)
    assert skipped == ["t.jsonl:2"]  # one unit: no (c_j, c_j + d+) pair, reported
    assert out[0].units == ("A white cat with black spots", "is lying on a red couch.")
    assert out[1].units == ()  # base/detail given: not segmented
    with pytest.raises(InputError, match="t.jsonl:9: give both 'base' and 'detail'"):
        specs_units([Example(None, "a b c", base="a", source="t.jsonl:9")])


def test_every_prmcs_batch_mixes_english_and_the_translations():
    import random

    langs = {"de": "d", "fr": "f", "es": "s", "ja": "j"}
    batch = [Example(None, f"cap {i}", translations=tuple(sorted(langs.items()))) for i in range(10)]
    for seed in range(5):
        pick = batch_languages(batch, random.Random(seed))
        assert sorted(pick[:5]) == ["de", "en", "es", "fr", "ja"] and sorted(pick[5:]) == sorted(pick[:5])
    assert languages_of(batch[0])["en"] == "cap 0"  # the caption is the English text


def test_human_written_perturbed_captions_are_used(tmp_path, make_images):
    img = make_images(1)[0]
    f = tmp_path / "fewshot.jsonl"
    f.write_text(json.dumps({"image": str(img), "caption": "a man plays golf",
                             "perturbed": ["a man man plays golf golf"]}) + "\n"
                 + json.dumps({"image": str(img), "caption": "a man plays golf",
                               "translations": {"de": "ein Mann spielt Golf"},
                               "perturbed": {"de": ["Golf spielt ein Mann"]}}) + "\n")
    a, b = read_jsonl(f)
    assert _given_perturbed(a, "en", "a man plays golf") == ("a man man plays golf golf",)
    assert _given_perturbed(b, "de", "ein Mann spielt Golf") == ("Golf spielt ein Mann",)
    assert _given_perturbed(b, "en", "a man plays golf") == ()  # none written for English: generated
    f.write_text(json.dumps({"image": str(img), "caption": "x", "perturbed": {"de": "not a list"}}) + "\n")
    with pytest.raises(InputError, match="fewshot.jsonl:1: 'perturbed' must be"):
        read_jsonl(f)


def test_prmcs_step_trains_on_the_datas_perturbed_captions(tmp_path, make_images, tiny_backbone):
    import copy
    import random

    from capscore.train.loop import PixelCache
    from capscore.train.recipes import make_step, resolve_params

    imgs = make_images(4)
    rows = [{"image": str(p), "caption": f"a red ball number {i}", "perturbed": [f"ball ball red {i}"]}
            for i, p in enumerate(imgs)]
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ex = read_jsonl(f)
    bb = copy.deepcopy(tiny_backbone)  # the recipe freezes towers: never touch the shared fixture
    r = get_recipe("prmcs")
    p = resolve_params(r, {"distill_steps": "0"})
    r.prepare(bb, p)
    loss, logs = make_step(r, p)(bb, ex, step=0, state={}, rng=random.Random(0), pixels=PixelCache(bb))
    assert logs["perturbed_from_data"] == 1.0  # English only: every perturbed caption came from the data


def test_cli_train_specs_from_plain_captions_reports_skipped(tmp_path, make_images, capsys):
    from capscore.cli import main

    imgs = make_images(3)
    caps = ["A white cat with black spots is lying on a red couch.",
            "Two people are walking along a sandy beach at sunset.", "A cat."]
    f = tmp_path / "long.jsonl"
    f.write_text("".join(json.dumps({"image": str(p), "caption": c}) + "\n" for p, c in zip(imgs, caps)))
    rc = main(["-q", "train", "specs", "--model", "capscore-test-tiny", "--data", str(f), "--steps", "1",
               "--batch-size", "2", "--accum", "1", "--eval-scenes", "0", "--out", str(tmp_path / "run")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "1 caption(s) have fewer than two detail units" in err and "long.jsonl:3" in err
    card = json.loads((tmp_path / "run" / "card.json").read_text())
    assert card["train_config"]["weight_decay"] == 0.01 and card["recipe_params"]["margin"] == "carried"
    assert card["train_config"]["betas"] == [0.9, 0.999]


def test_specs_on_scenes_trains_every_step_of_the_exact_units():
    """Scene examples carry the scene graph's own detail units, not a fixed first pair: SPECS draws
    c_j and d⁺ = unit j + 1 for every j (§3.1: every left-to-right prefix is a valid caption)."""
    import random

    from capscore.scenes import generate_scenes
    from capscore.train.data import scene_examples

    scenes = generate_scenes(6, seed=4)
    ex = scene_examples(6, seed=4)
    assert [e.units for e in ex] == [tuple(s.detail_units()) for s in scenes]
    kept, skipped = specs_units(ex)
    assert [e.units for e in kept] == [e.units for e in ex if len(e.units) > 1]  # not re-segmented
    assert skipped == [e.source for e in ex if len(e.units) < 2]
    e = max(kept, key=lambda x: len(x.units))
    rng = random.Random(0)
    seen = {specs_triplet(e, rng) for _ in range(300)}
    assert seen == {(" ".join(e.units[:j]), e.units[j]) for j in range(1, len(e.units))}


def test_specs_controlled_negatives_are_the_drawn_unit_made_false():
    """negatives=controlled (a diagnostic, not the paper's d⁻): d⁻ is d⁺ -- unit j + 1 of the drawn prefix --
    made false about the image (``Scene.false_detail_units``; ``_corrupt``'s falsity is tested in
    test_scenes.py), so c_j + d⁺ and c_j + d⁻ differ in one fact; the paper's batch negatives keep their
    draws; data without the scene graph is refused naming the example."""
    import random

    from capscore.train.data import negative_detail, scene_examples
    from capscore.train.recipes import specs_triplets

    ex = [e for e in scene_examples(8, seed=4) if len(e.units) > 2]
    assert all(len(e.false_units) == len(e.units) for e in ex)
    assert all(f != u for e in ex for f, u in zip(e.false_units, e.units))
    assert [e.false_units for e in ex] == [e.false_units for e in scene_examples(8, seed=4) if len(e.units) > 2]
    trip, neg = specs_triplets(ex, random.Random(3), negatives="controlled")
    for e, (base, pos), d in zip(ex, trip, neg):
        j = next(k for k in range(1, len(e.units)) if " ".join(e.units[:k]) == base)  # the prefix drawn
        assert pos == e.units[j] and d == e.false_units[j]
    rng, ref = random.Random(3), random.Random(3)
    trip_b, neg_b = specs_triplets(ex, rng, negatives="batch", shuffle_prob=0.9)
    want = [specs_triplet(e, ref) for e in ex]
    assert trip_b == want
    assert neg_b == [negative_detail([d for _, d in want], i, ref, shuffle_prob=0.9) for i in range(len(ex))]
    jsonl = Example(None, "a b", base="a dog", detail="on grass", source="t.jsonl:4")
    with pytest.raises(InputError, match="t.jsonl:4: negatives=controlled needs scene examples"):
        specs_triplets([jsonl], random.Random(0), negatives="controlled")
    with pytest.raises(CapscoreError, match="negatives"):
        get_recipe("specs").params_type(negatives="mixed")
