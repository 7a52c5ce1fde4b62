"""Suite loaders on small fixture files in the public formats; runners with a lookup scorer; the CLI."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from capscore.errors import InputError
from capscore.probes import formats as F
from capscore.probes import run as R


@pytest.fixture
def root(tmp_path, make_images):
    paths = make_images(4, size=32)
    return paths[0].parent


def table_scorer(table):
    """A pair scorer reading fixed scores: (image file name, text) -> float; ignores the encoder."""

    def score(encoder, images, texts):
        out = []
        for im, t in zip(images, texts):
            ref = F.ImageRef.of(im)
            out.append(table[(ref.path.name, t)])
        return torch.tensor(out, dtype=torch.float64)

    return score


class _FakeBackbone:
    spec, identity = "table", "table|w=0"


class _FakeEncoder:
    backbone = _FakeBackbone()


# ------------------------------------------------------------------ SugarCrepe: one JSON per subset, all kept
def test_sugarcrepe_subsets_all_kept(tmp_path, root):
    d = tmp_path / "sc"
    d.mkdir()
    (d / "replace_obj.json").write_text(json.dumps({
        "0": {"filename": "img0.png", "caption": "a dog", "negative_caption": "a cat"},
        "1": {"filename": "img1.png", "caption": "a car", "negative_caption": "a bus"}}, indent=1))
    (d / "swap_att.json").write_text(json.dumps({
        "0": {"filename": "img2.png", "caption": "red cup blue box", "negative_caption": "blue cup red box"}}))
    items = F.load_sugarcrepe(d, root)
    assert [i.subset for i in items] == ["replace_obj", "replace_obj", "swap_att"]
    assert items[1].source.endswith("replace_obj.json:7")  # indent=1: item "1" starts on line 7
    table = {("img0.png", "a dog"): .5, ("img0.png", "a cat"): .4, ("img1.png", "a car"): .1,
             ("img1.png", "a bus"): .3, ("img2.png", "red cup blue box"): .6, ("img2.png", "blue cup red box"): .2}
    res = R.run_suite(_FakeEncoder(), items, suite="sugarcrepe", scorer=table_scorer(table))
    by = {s["subset"]: s for s in res.summary}
    assert by["replace_obj"]["accuracy"] == 0.5 and by["swap_att"]["accuracy"] == 1.0
    assert by["mean-over-subsets"]["accuracy"] == 0.75
    assert [r["correct"] for r in res.rows] == [True, False, True]


def test_sugarcrepe_errors_name_file_line_field(tmp_path, root):
    f = tmp_path / "add_obj.json"
    f.write_text('{\n"0": {"filename": "img0.png", "caption": "a", "negative_caption": "b"},\n'
                 '"1": {"filename": "img1.png", "negative_caption": "b"}\n}')
    with pytest.raises(InputError, match=r"add_obj.json:3: missing field 'caption'"):
        F.load_sugarcrepe(f, root)
    f.write_text('[{"filename": "nope.png", "caption": "a", "negative_caption": "b"}]')
    with pytest.raises(InputError, match=r"add_obj.json:1: unknown image in field 'filename'"):
        F.load_sugarcrepe(f, root)
    f.write_text('[{"filename": "img0.png", "caption": 3, "negative_caption": "b"}]')
    with pytest.raises(InputError, match=r"field 'caption' must be a non-empty string"):
        F.load_sugarcrepe(f, root)


def test_sugarcrepe_pp_itt_and_tot(tmp_path, root):
    f = tmp_path / "replace_att.json"
    f.write_text(json.dumps([{"filename": "img0.png", "caption": "p1", "caption2": "p2", "negative_caption": "n"}]))
    items = F.load_sugarcrepe_pp(f, root)
    assert items[0].true_captions() == ((0, 1),)
    table = {("img0.png", "p1"): .5, ("img0.png", "p2"): .3, ("img0.png", "n"): .4}
    res = R.run_suite(_FakeEncoder(), items, suite="sugarcrepe++", scorer=table_scorer(table))
    assert res.rows[0]["correct"] is False  # p2 (0.3) < n (0.4)


# ------------------------------------------------------------------ ARO
def test_aro_relation_crop_and_macro(tmp_path, root):
    rows = []
    for k in range(3):
        rows.append({"image_id": k, "relation_name": "on" if k < 2 else "under", "bbox_x": 2, "bbox_y": 4,
                     "bbox_w": 10, "bbox_h": 6, "true_caption": f"t{k}", "false_caption": f"f{k}",
                     "image_path": f"img{k}.png"})
    f = tmp_path / "visual_genome_relation.json"
    f.write_text(json.dumps(rows))
    items = F.load_aro_vg_relation(f, root)
    key, im = items[0].images[0].load()
    assert im.size == (10, 6) and "crop=" in key
    expected = np.asarray(Image.open(root / "img0.png").convert("RGB"))[4:10, 2:12]
    assert np.array_equal(np.asarray(im), expected)
    table = {("img0.png", "t0"): .5, ("img0.png", "f0"): .4, ("img1.png", "t1"): .1, ("img1.png", "f1"): .3,
             ("img2.png", "t2"): .6, ("img2.png", "f2"): .2}
    res = R.run_suite(_FakeEncoder(), items, suite="aro-vg-relation", scorer=table_scorer(table), min_group_count=2)
    s = res.summary[0]
    assert s["macro_accuracy"] == 0.5 and s["n_groups"] == 1 and s["n_groups_excluded"] == 1
    assert s["accuracy"] == pytest.approx(2 / 3)


def test_aro_attribution_groups_and_bad_bbox(tmp_path, root):
    row = {"attributes": ["red", "blue"], "bbox_x": 0, "bbox_y": 0, "bbox_w": 5, "bbox_h": 5,
           "true_caption": "the red cup and the blue box", "false_caption": "the blue cup and the red box",
           "image_path": "img1.png"}
    f = tmp_path / "visual_genome_attribution.json"
    f.write_text(json.dumps([row]))
    assert F.load_aro_vg_attribution(f, root)[0].group == "red-blue"
    f.write_text(json.dumps([{**row, "bbox_w": "5"}]))
    with pytest.raises(InputError, match=r"attribution.json:1: field 'bbox_w' must be"):
        F.load_aro_vg_attribution(f, root)


def test_order_and_winoground_and_abc(tmp_path, root):
    f = tmp_path / "coco_order.jsonl"
    f.write_text(json.dumps({"image_path": "img0.png", "caption_options": ["a b c", "c b a", "b a c"]}) + "\n")
    assert F.load_aro_order(f, root)[0].captions == ("a b c", "c b a", "b a c")
    w = tmp_path / "examples.jsonl"
    w.write_text(json.dumps({"id": 0, "caption_0": "x on y", "caption_1": "y on x", "image_0": "img0",
                             "image_1": "img1", "tag": "Object"}) + "\n")
    it = F.load_winoground(w, root)[0]
    assert len(it.images) == 2 and it.group == "Object"
    table = {("img0.png", "x on y"): .6, ("img0.png", "y on x"): .5, ("img1.png", "x on y"): .4,
             ("img1.png", "y on x"): .7}
    res = R.run_suite(_FakeEncoder(), [it], suite="winoground", scorer=table_scorer(table))
    assert res.summary[0]["group_score"] == 1.0
    a = tmp_path / "abc.jsonl"
    a.write_text(json.dumps({"caption": "a red car and a blue bus", "swapped_caption": "a blue car and a red bus"})
                 + "\n")
    m = tmp_path / "map.json"
    m.write_text(json.dumps({"a red car and a blue bus": "img3.png"}))
    assert F.load_abc6k(a, root, mapping=m)[0].images[0].path.name == "img3.png"
    with pytest.raises(InputError, match=r"abc.jsonl:1: no image for this caption"):
        F.load_abc6k(a, root)


# ------------------------------------------------------------------ caption-level probes with exact scores
def test_run_perturb_counts_not_perturbable(tmp_path, root):
    items = [R.ProbeItem("0", root / "img0.png", "a dog chases a cat"), R.ProbeItem("1", root / "img1.png", "dog")]
    scores = {"a dog chases a cat": .5, "dog": .5}
    res = R.run_perturb(_FakeEncoder(), items, kinds=["jumble"], scorer=lambda e, i, t: torch.tensor(
        [scores.get(x, 0.1) for x in t]))
    s = res.summary[0]
    assert s["n"] == 1 and s["n_unchanged"] == 1 and s["robust_rate"] == 1.0


def test_run_perturb_percentage_change_of_the_mean_per_language(root):
    items = [R.ProbeItem("0", root / "img0.png", "a dog chases a cat", lang="en"),
             R.ProbeItem("1", root / "img1.png", "red ball", lang="en"),
             R.ProbeItem("2", root / "img2.png", "dog dog", lang="en"),  # jumble cannot change it
             R.ProbeItem("3", root / "img0.png", "ein Hund", lang="de")]
    scores = {"a dog chases a cat": .5, "red ball": .3, "dog dog": .6, "ein Hund": .2}
    res = R.run_perturb(_FakeEncoder(), items, kinds=["jumble", "masking"], p=1.0,
                        scorer=lambda e, i, t: torch.tensor([scores.get(x, 0.1) for x in t], dtype=torch.float64))
    by = {(s["lang"], s["kind"]): s for s in res.summary}
    j = by["en", "jumble"]
    # Table 2/7: change of the MEAN: originals (.5+.3+.6)/3, perturbed (.1+.1+.6)/3 (the unchanged caption keeps .6)
    assert j["pct_change"] == pytest.approx(100 * ((0.8 / 3) - (1.4 / 3)) / (1.4 / 3))  # -42.857%
    assert j["n"] == 2 and j["n_unchanged"] == 1
    assert j["robust_rate"] == 1.0 and j["mean_score_drop"] == pytest.approx((0.4 + 0.2) / 2)  # changed only
    m = by["en", "masking"]  # p = 1: every caption fully masked -> 0.1
    assert m["pct_change"] == pytest.approx(100 * (0.1 - 1.4 / 3) / (1.4 / 3))  # -78.571%
    avg = by["en", "average"]  # Table 2 "Perturbed Average": mean of the per-kind perturbed means
    assert avg["mean_perturbed"] == pytest.approx((0.8 / 3 + 0.1) / 2)
    assert avg["pct_change"] == pytest.approx((j["pct_change"] + m["pct_change"]) / 2)  # -60.714%
    assert by["de", "jumble"]["pct_change"] == pytest.approx(-50.0)  # .2 -> .1


def test_run_lgip_with_table(root):
    items = [R.ProbeItem("0", root / "img0.png", "a red dog")]

    def scorer(e, imgs, texts):  # original 0.5; paraphrases 0.45; flips: color 0.3, object 0.6
        out = []
        for t in texts:
            if t == "a red dog":
                out.append(.5)
            elif "red dog" in t:
                out.append(.45)
            elif t.endswith("dog"):
                out.append(.3)
            else:
                out.append(.6)
        return torch.tensor(out, dtype=torch.float64)

    res = R.run_lgip(_FakeEncoder(), items, scorer=scorer)
    by = {s["flip_type"]: s for s in res.summary}
    assert by["all"]["invariance_error"] == pytest.approx(0.05)
    assert by["color"]["positive_rate"] == 1.0 and by["object"]["positive_rate"] == 0.0
    assert by["all"]["positive_rate"] == 0.5 and by["all"]["gap_mean"] == pytest.approx((0.2 - 0.1) / 2)


# ------------------------------------------------------------------ real encoder: cache shared, CLI end to end
def test_encoder_encodes_each_unique_text_once(tiny_backbone, root):
    from capscore.embed.engine import Encoder

    enc = Encoder(tiny_backbone, batch_size=16)
    items = [R.ProbeItem(str(i), root / f"img{i}.png", c) for i, c in enumerate(["a red dog", "two black cats"])]
    R.run_lgip(enc, items)
    first = enc.stats.texts_encoded
    R.run_lgip(enc, items)
    assert enc.stats.texts_encoded == first and enc.stats.images_encoded == 2


def test_cli_probe_two_models(tmp_path, root, capsys):
    from capscore.cli import main

    f = tmp_path / "replace_obj.json"
    f.write_text(json.dumps({"0": {"filename": "img0.png", "caption": "a dog", "negative_caption": "a cat"}}))
    out = tmp_path / "out"
    rc = main(["-q", "probe", "--model", "capscore-test-tiny", "--model", "openclip:capscore-test-tiny", "--suite",
               "sugarcrepe", "--data", str(f), "--images", str(root), "--out", str(out), "--format", "parquet"])
    assert rc == 0
    summary = json.loads((out / "sugarcrepe.summary.json").read_text())
    assert len(summary) == 2 and summary[0]["summary"][0]["n"] == 1
    import pandas as pd

    assert len(pd.read_parquet(out / "sugarcrepe__capscore-test-tiny.parquet")) == 1
    table = capsys.readouterr().out
    assert "accuracy" in table and "openclip:capscore-test-tiny" in table


def test_cli_bad_file_is_one_line(tmp_path, root, capsys):
    from capscore.cli import main

    f = tmp_path / "caps.jsonl"
    f.write_text('{"image": "img0.png", "caption": "a dog"}\n{"image": "img9.png", "caption": "x y"}\n')
    rc = main(["probe", "--model", "capscore-test-tiny", "--suite", "perturb", "--data", str(f), "--images",
               str(root), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "caps.jsonl:2: unknown image in field 'image'" in err


def test_cli_probe_abe_options(tmp_path, root, capsys):
    """--scorer abe --abe-omega 1 is the global cosine (ABE eq. 12 with ω = 1): every per-item number equals
    the cosine scorer's; ABE flags with another scorer, or a bad K, are one-line errors."""
    from capscore.cli import main

    f = tmp_path / "replace_att.json"
    f.write_text(json.dumps({"0": {"filename": "img0.png", "caption": "a red dog", "negative_caption": "a blue dog"},
                             "1": {"filename": "img1.png", "caption": "two black cats", "negative_caption": "two white cats"}}))
    base = ["-q", "probe", "--model", "capscore-test-tiny", "--suite", "sugarcrepe", "--data", str(f),
            "--images", str(root)]
    assert main(base + ["--out", str(tmp_path / "cos")]) == 0
    assert main(base + ["--scorer", "abe", "--abe-omega", "1", "--abe-k", "3", "--out", str(tmp_path / "abe")]) == 0

    def numbers(folder):
        rows = [json.loads(x) for x in (folder / "sugarcrepe__capscore-test-tiny.jsonl").read_text().splitlines()]
        return [r["scores"] for r in rows]  # [[positive, negative]] per item, rounded to 6 decimals

    cos, abe = numbers(tmp_path / "cos"), numbers(tmp_path / "abe")
    assert len(cos) == len(abe) == 2
    np.testing.assert_allclose(abe, cos, atol=2e-6)
    capsys.readouterr()
    assert main(base + ["--abe-k", "3", "--out", str(tmp_path / "x")]) == 2
    assert "--abe-k/--abe-p/--abe-omega/--concept-pool apply to --scorer abe only" in capsys.readouterr().err
    assert main(base + ["--scorer", "abe", "--abe-k", "0", "--out", str(tmp_path / "y")]) == 2
    assert "argument --abe-k: must be a positive integer; got 0" in capsys.readouterr().err


def test_probe_items_read_critical_objects(tmp_path, root):
    """M-FineCap3k's "Critical Objects" as a field: a list, or comma-separated text ("、" in Japanese)."""
    f = tmp_path / "caps.jsonl"
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in [
        {"image": "img0.png", "caption": "a b", "lang": "de", "critical_objects": "Packungen, Flaschen,Pralinen"},
        {"image": "img1.png", "caption": "c d", "lang": "ja", "critical_objects": "人影、スマホ"},
        {"image": "img2.png", "caption": "e f", "critical_objects": ["white shirt", " golf "]},
        {"image": "img3.png", "caption": "g h", "objects": ["x", "y"], "critical_objects": "ignored, here"}]) + "\n")
    items = F.load_probe_items(f, root)
    assert [it.objects for it in items] == [("Packungen", "Flaschen", "Pralinen"), ("人影", "スマホ"),
                                            ("white shirt", "golf"), ("x", "y")]
    f.write_text(json.dumps({"image": "img0.png", "caption": "a", "critical_objects": [1]}) + "\n")
    with pytest.raises(InputError, match="caps.jsonl:1: field 'critical_objects' must be a list of strings"):
        F.load_probe_items(f, root)
