"""End to end: capscore correlate with the tiny random open_clip model; expected numbers recomputed by hand
from the encoder's vectors (cos, clamp, harmonic mean) and scipy."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from scipy import stats as st

from capscore.cli import main
from capscore.embed.engine import Encoder
from capscore.meta.datasets import load_flickr8k, load_pascal50s
from capscore.meta.evaluate import evaluate, evaluate_pairs

PREFIX = "A photo depicts "
CAPTIONS = ["a red square", "two blue circles", "a green triangle on the left", "noise", "a photo of a dog",
            "an empty scene", "three yellow stars", "a small purple circle"]


def _flickr(tmp_path, make_images, n_images=6):
    paths = make_images(n_images)
    rng = np.random.default_rng(1)
    data = {}
    for i, p in enumerate(paths):
        caps = [CAPTIONS[(i + k) % len(CAPTIONS)] for k in range(3)]
        data[f"img{i}"] = {"image_id": f"img{i}", "image_path": f"images/{p.name}",
                           "ground_truth": [CAPTIONS[(i + 4) % len(CAPTIONS)], "a picture"],
                           "human_judgement": [{"image_id": f"img{i}", "image_path": f"images/{p.name}", "caption": c,
                                                "rating": float(rng.integers(1, 5))} for c in caps]}
    f = tmp_path / "flickr8k.json"
    f.write_text(json.dumps(data))
    return f, data


def _clip_s_by_hand(encoder, images, captions, w=2.5):
    img = encoder.encode_images(images)
    txt = encoder.encode_texts([PREFIX + c for c in captions])
    return (w * (img * txt).sum(-1).clamp(min=0)).numpy()


def test_correlate_cli_flickr8k_expert(tmp_path, make_images, tiny_backbone, capsys):
    f, data = _flickr(tmp_path, make_images)
    out = tmp_path / "out"
    rc = main(["-q", "correlate", "--dataset", "flickr8k-expert", "--path", str(f), "--images", str(tmp_path),
               "--model", "capscore-test-tiny", "--metric", "clip-s", "refclip-s", "--bootstrap", "50",
               "--out", str(out), "--no-cache"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "tau_c" in printed and "clip-s" in printed and "refclip-s" in printed
    res = json.loads((out / "correlate.json").read_text())["results"]
    assert [r["metric"] for r in res] == ["clip-s", "refclip-s"]
    assert res[0]["identity"] == tiny_backbone.identity and res[0]["prefix"] == PREFIX
    # expected: CLIP-S by hand on the same vectors, tau-c by scipy
    enc = Encoder(tiny_backbone)
    images, caps, human = [], [], []
    for v in data.values():
        for hj in v["human_judgement"]:
            images.append(tmp_path / v["image_path"])
            caps.append(hj["caption"])
            human.append(hj["rating"])
    s = _clip_s_by_hand(enc, images, caps)
    # PAC-S's Flickr8k-Expert table shows Kendall tau-b and tau-c side by side: both by default
    assert [x["name"] for x in res[0]["stats"]] == ["tau_b", "tau_c"]
    tau_b, tau = res[0]["stats"]
    assert res[0]["n"] == len(caps)
    assert tau["value"] == pytest.approx(100 * st.kendalltau(s, human, variant="c").statistic, abs=1e-6)
    assert tau_b["value"] == pytest.approx(100 * st.kendalltau(s, human, variant="b").statistic, abs=1e-6)
    assert tau["ci_low"] <= tau["value"] <= tau["ci_high"]
    rows = list(csv.DictReader(open(out / "correlate.csv")))
    assert float(rows[0]["tau_c"]) == pytest.approx(tau["value"])


def test_second_metric_reuses_the_cache(tmp_path, make_images, tiny_backbone):
    f, _ = _flickr(tmp_path, make_images)
    ds = load_flickr8k(f, tmp_path)
    enc = Encoder(tiny_backbone)
    evaluate(ds, enc, "clip-s", n_resamples=0)
    images, texts = enc.stats.images_encoded, enc.stats.texts_encoded
    r = evaluate(ds, enc, "refclip-s", n_resamples=0)
    assert enc.stats.images_encoded == images  # no image re-encoded
    new = {ref for it in ds.items for ref in it.record.refs} - {it.record.caption for it in ds.items}
    assert len(new) >= 1
    assert enc.stats.texts_encoded - texts == len(new)  # only the texts not seen before (new references)
    assert r.get("tau_c") is not None


def _pascal_fixture(tmp_path, make_images):
    paths = make_images(8)
    rows = []
    for i, p in enumerate(paths):
        rows.append({"image": p.name, "a": CAPTIONS[i], "b": CAPTIONS[(i + 3) % 8], "category": ["HC", "HI", "HM", "MM"][i % 4],
                     "refs": [CAPTIONS[(i + k) % 8] for k in range(1, 7)], "label": i % 2})
    f = tmp_path / "pascal.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return f, rows


def test_pascal_accuracy_by_hand(tmp_path, make_images, tiny_backbone):
    f, rows = _pascal_fixture(tmp_path, make_images)
    ds = load_pascal50s(f, tmp_path / "images")
    enc = Encoder(tiny_backbone)
    res = evaluate_pairs(ds, enc, "clip-s", n_resamples=0)
    imgs = [tmp_path / "images" / r["image"] for r in rows]
    sa, sb = _clip_s_by_hand(enc, imgs, [r["a"] for r in rows]), _clip_s_by_hand(enc, imgs, [r["b"] for r in rows])
    right = [(1.0 if (b > a) == (r["label"] == 1) else 0.0) if a != b else 0.5 for a, b, r in zip(sa, sb, rows)]
    by_cat = {c: 100 * np.mean([x for x, r in zip(right, rows) if r["category"] == c]) for c in ("HC", "HI", "HM", "MM")}
    assert [s.name for s in res.stats] == ["HC", "HI", "HM", "MM", "mean"]
    for c, v in by_cat.items():
        assert res.value(c) == pytest.approx(v)
    assert res.value("mean") == pytest.approx(np.mean(list(by_cat.values())))

    # RefCLIP-S with all references, by hand: H-mean(CLIP-S, max(max_r cos(c, r), 0))
    full = evaluate_pairs(ds, enc, "refclip-s", ref_sample=None, n_resamples=0)

    def ref_s(caps):
        c = enc.encode_texts([PREFIX + x for x in caps])
        out = []
        for k, r in enumerate(rows):
            rv = enc.encode_texts([PREFIX + x for x in r["refs"]])
            out.append(max(float((rv @ c[k]).max()), 0.0))
        return np.array(out)

    def hmean(x, y):
        return np.where(x + y > 0, 2 * x * y / np.where(x + y > 0, x + y, 1), 0)

    ra, rb = hmean(sa, ref_s([r["a"] for r in rows])), hmean(sb, ref_s([r["b"] for r in rows]))
    right = [(1.0 if (b > a) == (r["label"] == 1) else 0.0) if a != b else 0.5 for a, b, r in zip(ra, rb, rows)]
    assert full.value("mean") == pytest.approx(np.mean([100 * np.mean([x for x, r in zip(right, rows)
                                                                        if r["category"] == c]) for c in by_cat]))
    # drawing at least as many references as there are is the same as using all of them
    assert evaluate_pairs(ds, enc, "refclip-s", ref_sample=6, n_resamples=0).stats == full.stats
    sub = evaluate_pairs(ds, enc, "refclip-s", ref_sample=1, ref_draws=3, n_resamples=0, seed=2)
    assert sub.params["ref_sample"] == 1 and sub.params["ref_draws"] == 3


def test_scores_file_against_human_file(tmp_path, capsys):
    rng = np.random.default_rng(0)
    human = rng.integers(1, 6, 30).astype(float)
    score = human + rng.normal(0, 1.5, 30)
    (tmp_path / "scores.jsonl").write_text(
        "".join(json.dumps({"id": f"c{i}", "score": float(s), "error": None}) + "\n" for i, s in enumerate(score))
        + json.dumps({"id": "c99", "score": None, "error": "x.jpg: image file not found"}) + "\n")
    with open(tmp_path / "human.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "rating"])
        w.writerows([(f"c{i}", h) for i, h in enumerate(human)] + [("c30", 3)])
    rc = main(["correlate", "--scores", str(tmp_path / "scores.jsonl"), "--human", str(tmp_path / "human.csv"),
               "--stats", "tau_b", "pearson", "--bootstrap", "0", "--out", str(tmp_path / "o")])
    assert rc == 0
    res = json.loads((tmp_path / "o" / "correlate.json").read_text())["results"][0]
    vals = {s["name"]: s["value"] for s in res["stats"]}
    assert vals["tau_b"] == pytest.approx(100 * st.kendalltau(score, human).statistic)
    assert vals["pearson"] == pytest.approx(100 * st.pearsonr(score, human).statistic)
    # the error row c99 has no human item, so no human item is skipped for it (it is reported as an
    # unmatched score row); c30 has no score: 30 matched + 1 skipped = the 31 human items
    assert res["n"] == 30 and res["skipped"] == {"no score for the id": 1}


def test_export_items_round_trip(tmp_path, make_images):
    f, data = _flickr(tmp_path, make_images)
    items = tmp_path / "items.jsonl"
    assert main(["correlate", "--dataset", "flickr8k-expert", "--path", str(f), "--images", str(tmp_path),
                 "--export-items", str(items)]) == 0
    rows = [json.loads(x) for x in items.read_text().splitlines()]
    assert len(rows) == 18 and rows[0]["id"] == "img0#0" and rows[0]["refs"]
    human = [hj["rating"] for v in data.values() for hj in v["human_judgement"]]
    fake = np.arange(len(rows), dtype=float)[::-1]  # an "external metric"
    (tmp_path / "s.csv").write_text("id,score\n" + "".join(f"{r['id']},{s}\n" for r, s in zip(rows, fake)))
    assert main(["correlate", "--scores", str(tmp_path / "s.csv"), "--dataset", "flickr8k-expert", "--path", str(f),
                 "--images", str(tmp_path), "--bootstrap", "0", "--out", str(tmp_path / "o")]) == 0
    res = json.loads((tmp_path / "o" / "correlate.json").read_text())["results"][0]
    vals = {x["name"]: x["value"] for x in res["stats"]}
    assert vals["tau_c"] == pytest.approx(100 * st.kendalltau(fake, human, variant="c").statistic)
    assert vals["tau_b"] == pytest.approx(100 * st.kendalltau(fake, human, variant="b").statistic)


def test_constant_human_scores_fail_in_one_line(tmp_path, capsys):
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"id": str(i), "score": i}) + "\n" for i in range(5)))
    (tmp_path / "h.jsonl").write_text("".join(json.dumps({"id": str(i), "score": 3}) + "\n" for i in range(5)))
    rc = main(["correlate", "--scores", str(tmp_path / "s.jsonl"), "--human", str(tmp_path / "h.jsonl")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "human scores are constant" in err


def test_scenes_oracle_clip_s_correlates_with_f1():
    pytest.importorskip("capscore.scenes.tiny", reason="scenes-tiny (capscore.scenes.tiny) has not landed yet")
    from capscore.backbones import load_backbone
    from capscore.meta.datasets import load_dataset

    ds = load_dataset("scenes-oracle", seed=0, n_scenes=40)
    enc = Encoder(load_backbone("scenes-tiny"))
    res = evaluate(ds, enc, "clip-s", prefix="", n_resamples=0)
    assert res.value("tau_b") > 0 and res.value("pearson") > 0


def test_correlate_draws_the_oracle_scenes_at_each_models_input_size(monkeypatch, tmp_path, capsys):
    """scenes-tiny takes 96 px and the v1 architecture 64 px (random weights: only its input size matters
    here): each scores the same captions on scenes drawn at its own size (not 64-px drawings upsampled by
    the 96-px preprocessing)."""
    import capscore.meta.oracle as oracle
    from capscore.cli import main

    seen, real = [], oracle.scenes_oracle

    def spy(**kw):
        ds = real(**kw)
        seen.append({i.record.image.image.size for i in ds.items})
        return ds

    monkeypatch.setattr(oracle, "scenes_oracle", spy)
    assert main(["-q", "correlate", "--dataset", "scenes-oracle", "--scenes", "3", "--model", "scenes-tiny",
                 "openclip:scenes-tiny-v1", "--metric", "clip-s", "--bootstrap", "0", "--no-cache"]) == 0
    assert seen == [{(64, 64)}, {(96, 96)}, {(64, 64)}]  # the default, then one set per model
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "clip-s" in ln.lower()]
    assert len(rows) == 2
    # the in-memory scenes-video clips likewise
    import capscore.meta.video as video

    clips, real_v = [], video.scenes_video_oracle

    def spy_v(path=None, **kw):
        ds = real_v(path, **kw)
        clips.append({f.size for it in ds.items for f in it.image.frames})
        return ds

    monkeypatch.setattr(video, "scenes_video_oracle", spy_v)
    assert main(["-q", "correlate", "--dataset", "scenes-video", "--scenes", "2", "--model", "scenes-tiny",
                 "--metric", "clip-s", "--bootstrap", "0", "--no-cache"]) == 0
    assert clips == [{(64, 64)}, {(96, 96)}]


def _rating_set(name, human, langs=None, groups=None):
    from capscore.data.records import Record
    from capscore.data.images import ImageRef
    from capscore.meta.datasets import Rated, RatingSet

    items = tuple(Rated(Record(f"c{i}", ImageRef(name="x"), "c"), float(h), group=(groups[i] if groups else f"g{i}"),
                        lang=(langs[i] if langs else "")) for i, h in enumerate(human))
    return RatingSet(name, "test", items)


@pytest.mark.parametrize("name", ["flickr8k-expert", "flickr8k-cf", "composite"])
def test_flickr8k_and_composite_default_to_tau_b_and_tau_c(name):
    # PAC-S's Flickr8k-Expert/CF and Composite tables show Kendall tau-b AND tau-c
    from capscore.meta.evaluate import correlate_scores

    rng = np.random.default_rng(2)
    human = rng.integers(1, 5, 40).astype(float)
    score = human + rng.normal(0, 1, 40)
    r = correlate_scores({f"c{i}": s for i, s in enumerate(score)}, _rating_set(name, human), metric_name="m",
                         n_resamples=0)
    assert [s.name for s in r.stats] == ["tau_b", "tau_c"]
    assert r.value("tau_b") == pytest.approx(100 * st.kendalltau(score, human, variant="b").statistic)
    assert r.value("tau_c") == pytest.approx(100 * st.kendalltau(score, human, variant="c").statistic)


def test_m_capeval1k_defaults_to_tau_c_and_pearson_per_language():
    # PR-MCS Tables 1 and 3: Kendall tau-c and Pearson rho for each language
    from capscore.meta.evaluate import correlate_scores

    rng = np.random.default_rng(4)
    langs = ["en", "de", "ja"] * 20
    human = rng.integers(1, 6, 60).astype(float)
    score = human + rng.normal(0, 2, 60)
    r = correlate_scores({f"c{i}": s for i, s in enumerate(score)}, _rating_set("m-capeval1k", human, langs),
                         metric_name="mcs", n_resamples=0)
    assert [s.name for s in r.stats] == ["de:tau_c", "en:tau_c", "ja:tau_c", "de:pearson", "en:pearson", "ja:pearson"]
    la = np.array(langs)
    for lang in ("en", "de", "ja"):
        sel = la == lang
        assert r.value(f"{lang}:tau_c") == pytest.approx(100 * st.kendalltau(score[sel], human[sel], variant="c").statistic)
        assert r.value(f"{lang}:pearson") == pytest.approx(100 * st.pearsonr(score[sel], human[sel]).statistic)


def test_decapbench_shows_specs_table2_columns(capsys):
    # SPECS Table 2: PCC rho, 1 - R^2 (unfitted, x1), Kd tau, Sp tau
    from capscore.meta.run import format_results as format_table
    from capscore.meta.evaluate import correlate_scores

    human = np.array([1, 2, 4, 3, 5, 2, 1, 4, 3, 5, 2, 3], dtype=float)
    score = np.array([0.8, 0.7, 0.9, 0.75, 0.85, 0.6, 0.7, 0.95, 0.72, 0.9, 0.65, 0.8])
    groups = [f"img{i // 3}" for i in range(12)]
    r = correlate_scores({f"c{i}": s for i, s in enumerate(score)}, _rating_set("decapbench", human, groups=groups),
                         metric_name="clip-s", n_resamples=0)
    assert [s.name for s in r.stats] == ["pearson", "one_minus_r2", "tau_b", "sample_tau_b"]
    # unfitted: scores on a 0-1 scale predicting 1-5 human scores -> far worse than the mean (> 1)
    expected = float(((human - score) ** 2).sum() / ((human - human.mean()) ** 2).sum())
    assert r.value("one_minus_r2") == pytest.approx(expected)
    table = format_table([r])
    assert f"{expected:.4g}" in table and "×1, as SPECS Table 2" in table
