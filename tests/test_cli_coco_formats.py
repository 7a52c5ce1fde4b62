"""`capscore score` with COCO files: results in and out, captions_*.json as references, several candidates
per image, RefCLIP-S components, and several models in one combined, resumable output.

Expected values come from open_clip alone (helpers of test_cli_score.py) and the formulas by hand.
"""
import json

import numpy as np
import pytest
from test_cli_score import MODEL, PREFIX, hmean, ref_cos, ref_model, ref_text_sim  # noqa: F401 (fixture)

from capscore.cli import main


@pytest.fixture
def coco(tmp_path, make_images):
    paths = make_images(3, folder="val2014")
    folder = paths[0].parent
    named = []
    for i, p in enumerate(paths):  # COCO file names: the numeric image_id is the stem's trailing number
        q = folder / f"COCO_val2014_{i + 40:012d}.png"
        p.rename(q)
        named.append(q)
    results = [{"image_id": 40, "caption": "a red square"}, {"image_id": 41, "caption": "two dogs"},
               {"image_id": 40, "caption": "a blue circle"}, {"image_id": 42, "caption": "a bowl"}]
    (tmp_path / "results.json").write_text(json.dumps(results))
    captions = {"images": [{"id": 40 + i, "file_name": q.name} for i, q in enumerate(named)],
                "annotations": [{"image_id": 40, "caption": "a square"}, {"image_id": 40, "caption": "red"},
                                {"image_id": 41, "caption": "dogs"}, {"image_id": 42, "caption": "fruit"}]}
    (tmp_path / "captions_val2014.json").write_text(json.dumps(captions))
    return tmp_path, folder, named, results, captions


def run(tmp_path, folder, *args):
    return main(["-q", "score", "--images", str(folder), "--captions", str(tmp_path / "results.json"),
                 "--no-cache", *map(str, args)])


def test_coco_results_in_and_out_with_refclip_s_components(coco, ref_model):
    tmp_path, folder, named, results, captions = coco
    out = tmp_path / "scores.json"
    assert run(tmp_path, folder, "--model", MODEL, "--refs", tmp_path / "captions_val2014.json",
               "--metric", "refclip-s", "--out", out) == 0
    rows = json.loads(out.read_text())
    assert [r["image_id"] for r in rows] == [40, 41, 40, 42]  # COCO results: integer ids, candidates kept
    assert [r["id"] for r in rows] == ["40#0", "41", "40#1", "42"]
    by_id = {a: [c["caption"] for c in captions["annotations"] if c["image_id"] == a] for a in (40, 41, 42)}
    cands = [r["caption"] for r in results]
    imgs = [named[r["image_id"] - 40] for r in results]
    clip = 2.5 * np.maximum(ref_cos(ref_model, imgs, [PREFIX + c for c in cands]), 0)
    refp = ref_text_sim(ref_model, [PREFIX + c for c in cands],
                        [[PREFIX + x for x in by_id[r["image_id"]]] for r in results])
    np.testing.assert_allclose([r["image_score"] for r in rows], clip, atol=2e-5)
    np.testing.assert_allclose([r["ref_score"] for r in rows], refp, atol=2e-5)
    np.testing.assert_allclose([r["score"] for r in rows], hmean(clip, refp), atol=2e-5)


def test_candidates_as_a_list_per_image(coco, ref_model):
    tmp_path, folder, named, _, _ = coco
    (tmp_path / "results.json").write_text(json.dumps({named[0].stem: ["one dog", "two dogs"],
                                                      named[1].stem: "a cat"}))
    out = tmp_path / "s.jsonl"
    assert run(tmp_path, folder, "--model", MODEL, "--out", out) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"{named[0].stem}#0", f"{named[0].stem}#1", named[1].stem]
    expected = 2.5 * np.maximum(ref_cos(ref_model, [named[0], named[0], named[1]],
                                        [PREFIX + c for c in ("one dog", "two dogs", "a cat")]), 0)
    np.testing.assert_allclose([r["score"] for r in rows], expected, atol=2e-5)


def test_several_models_one_table_one_output_and_resume(coco, capsys):
    tmp_path, folder, *_ = coco
    out = tmp_path / "two.csv"
    models = [MODEL, f"openclip:{MODEL}"]  # the same weights under two names: scores must agree
    assert run(tmp_path, folder, "--model", *models, "--metric", "clip-s", "pac-s", "--out", out) == 0
    import pandas as pd

    df = pd.read_csv(out)
    assert list(df.columns) == ["id", "image", "caption", "system", "model", "metric", "score", "error"]
    assert len(df) == 4 * 2 * 2 and set(df.model) == set(models)
    a = df[(df.model == models[0]) & (df.metric == "clip-s")].score.to_numpy()
    b = df[(df.model == models[1]) & (df.metric == "pac-s")].score.to_numpy()
    np.testing.assert_allclose(b, a * 2.0 / 2.5, rtol=1e-6)
    table = capsys.readouterr().out
    assert table.count("results") == 4 and "model" in table and "metric" in table
    summary = json.loads((tmp_path / "two.csv.summary.json").read_text())
    assert [(r["model"], r["metric"]) for r in summary["runs"]] == [(m, k) for m in models for k in ("clip-s", "pac-s")]
    # cut the file after 6 data rows (mid second run) and resume: the same file, nothing twice
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:7]))
    assert run(tmp_path, folder, "--model", *models, "--metric", "clip-s", "pac-s", "--out", out, "--resume") == 0
    again = pd.read_csv(out)
    pd.testing.assert_frame_equal(again, df)
