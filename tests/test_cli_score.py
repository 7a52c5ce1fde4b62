"""`capscore score` end to end on capscore-test-tiny: every input shape, every bad input, resume.

Expected scores are recomputed here with open_clip alone (same random init:
``torch.manual_seed(0)`` then ``create_model_and_transforms``), full 77-token
padding, and the CLIPScore formulas written out by hand.
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import open_clip
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers the capscore-test-tiny config with open_clip)
from capscore.cli import main

MODEL = "capscore-test-tiny"
PREFIX = "A photo depicts "


@pytest.fixture(scope="module")
def ref_model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _, preprocess = open_clip.create_model_and_transforms(MODEL, pretrained=None)
    return model.eval(), preprocess, open_clip.get_tokenizer(MODEL)


def ref_cos(ref_model, image_paths, texts):
    model, preprocess, tok = ref_model
    with torch.no_grad():
        im = model.encode_image(torch.stack([preprocess(Image.open(p).convert("RGB")) for p in image_paths]))
        tx = model.encode_text(tok(list(texts)))
    im = im / im.norm(dim=-1, keepdim=True)
    tx = tx / tx.norm(dim=-1, keepdim=True)
    return (im * tx).sum(-1).numpy().astype(np.float64)


def ref_text_sim(ref_model, cands, refs):
    """max_r cos(candidate, r), clamped at 0, per candidate."""
    model, _, tok = ref_model
    with torch.no_grad():
        c = torch.nn.functional.normalize(model.encode_text(tok(list(cands))), dim=-1)
        rs = [torch.nn.functional.normalize(model.encode_text(tok(list(r))), dim=-1) for r in refs]
    return np.array([max(float((c[i] @ rs[i].T).max()), 0.0) for i in range(len(cands))])


def hmean(a, b):
    return np.where(a + b > 0, 2 * a * b / np.where(a + b > 0, a + b, 1), 0.0)


def score(tmp_path, *args, quiet=True):
    cache = [] if "--no-cache" in args else ["--cache-dir", tmp_path / "cache"]
    argv = (["-q"] if quiet else []) + ["score", "--model", MODEL, *cache, *args]
    return main([str(a) for a in argv])


def rows(path):
    return [json.loads(line) for line in open(path)]


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("capscore: error: ") and "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def data(tmp_path, make_images):
    paths = make_images(4)
    caps = {f"img{i}": f"a {c} square" for i, c in enumerate(["red", "green", "blue", "noisy"])}
    (tmp_path / "sysA.json").write_text(json.dumps(caps))
    (tmp_path / "sysB.json").write_text(json.dumps({k: v.replace("square", "circle") for k, v in caps.items()}))
    refs = {f"img{i}": [f"reference {i}", "a colourful pattern"] for i in range(4)}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    return paths, caps, refs


def test_json_shape_clip_s_matches_open_clip_by_hand(tmp_path, data, ref_model, capsys):
    paths, caps, _ = data
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--out", out) == 0
    got = rows(out)
    assert [r["id"] for r in got] == list(caps) and all(r["system"] == "sysA" and r["error"] is None for r in got)
    cos = ref_cos(ref_model, paths, [PREFIX + c for c in caps.values()])
    expected = 2.5 * np.clip(cos, 0, None)
    np.testing.assert_allclose([r["score"] for r in got], expected, atol=1e-5)
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["status"] == "complete" and summary["count"] == 4 and summary["skipped"] == 0
    assert summary["mean"] == pytest.approx(expected.mean(), abs=1e-5)
    assert "4 scored, 0 skipped" in capsys.readouterr().out


def test_refclip_s_with_two_systems_gives_system_means(tmp_path, data, ref_model, capsys):
    paths, caps, refs = data
    out = tmp_path / "o.csv"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", tmp_path / "sysB.json",
                 "--refs", tmp_path / "refs.json", "--metric", "refclip-s", "--prefix", "", "--out", out) == 0
    df = pd.read_csv(out, keep_default_na=False)
    assert df["system"].tolist() == ["sysA"] * 4 + ["sysB"] * 4
    expected = {}
    for system in ("sysA", "sysB"):
        texts = json.loads((tmp_path / f"{system}.json").read_text())
        c = 2.5 * np.clip(ref_cos(ref_model, paths, list(texts.values())), 0, None)
        h = hmean(c, ref_text_sim(ref_model, list(texts.values()), [refs[k] for k in texts]))
        np.testing.assert_allclose(df[df.system == system]["score"].to_numpy(float), h, atol=1e-5)
        expected[system] = h.mean()
    summary = json.loads((tmp_path / "o.csv.summary.json").read_text())
    assert summary["systems"] == pytest.approx(expected, abs=1e-5)
    assert summary["prefix"] == ""
    printed = capsys.readouterr().out
    assert "sysA" in printed and "sysB" in printed


def test_jsonl_csv_manifest_inputs_and_parquet_output(tmp_path, data, ref_model):
    paths, _, _ = data
    man = tmp_path / "manifest.csv"
    with open(man, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "path"])
        for i, p in enumerate(paths):
            w.writerow([f"pic{i}", p])
    jl = tmp_path / "cands.jsonl"
    jl.write_text("".join(json.dumps({"image": f"pic{i % 4}", "caption": f"thing {i}", "id": f"c{i}"}) + "\n"
                          for i in range(6)))
    out = tmp_path / "o.parquet"
    assert score(tmp_path, "--images", man, "--captions", jl, "--metric", "pac-s", "--out", out) == 0
    df = pd.read_parquet(out)
    assert df["id"].tolist() == [f"c{i}" for i in range(6)]
    cos = ref_cos(ref_model, [paths[i % 4] for i in range(6)], [PREFIX + f"thing {i}" for i in range(6)])
    np.testing.assert_allclose(df["score"].to_numpy(), 2.0 * np.clip(cos, 0, None), atol=1e-5)  # PAC-S: w = 2
    # CSV captions with image paths relative to --images, and in-line refs
    cs = tmp_path / "cands.csv"
    cs.write_text('image,caption,refs\nimg1.png,"a, b","[""r one"", ""r two""]"\n')
    out2 = tmp_path / "o2.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", cs, "--metric", "refpac-s", "--out", out2) == 0
    (row,) = rows(out2)
    c = 2.0 * np.clip(ref_cos(ref_model, [paths[1]], [PREFIX + "a, b"]), 0, None)
    t = ref_text_sim(ref_model, [PREFIX + "a, b"], [[PREFIX + "r one", PREFIX + "r two"]])
    assert row["image"] == str(paths[1]) and row["score"] == pytest.approx(float(hmean(c, t)[0]), abs=1e-5)


def write_jsonl(path, items):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items))
    return path


BAD_CASES = {
    "missing image": ({"image": "nope.png", "caption": "x"}, ["bad.jsonl:2", "nope.png", "not found"]),
    "unreadable image": ({"image": "adir.png", "caption": "x"}, ["bad.jsonl:2", "adir.png", "not a regular file"]),
    "truncated image": ({"image": "cut.png", "caption": "x"}, ["bad.jsonl:2", "cut.png", "truncated"]),
    "not an image": ({"image": "text.png", "caption": "x"}, ["bad.jsonl:2", "text.png", "not an image"]),
    "empty caption": ({"image": "img1.png", "caption": "  "}, ["bad.jsonl:2", "empty caption"]),
    "non-string caption": ({"image": "img1.png", "caption": 42}, ["bad.jsonl:2", "not a string", "42"]),
    "caption without image": ({"image": "", "caption": "x"}, ["bad.jsonl:2", "caption without image"]),
    "duplicate id": ({"image": "img1.png", "caption": "x", "id": "first"}, ["bad.jsonl:2", "duplicate id 'first'"]),
    "malformed line": ('{"image": "img1.png", "caption": ', ["bad.jsonl:2", "malformed JSON line"]),
    "missing field": ({"image": "img1.png"}, ["bad.jsonl:2", "missing field 'caption'"]),
}


@pytest.fixture
def bad_images(tmp_path, data):
    paths, _, _ = data
    d = paths[0].parent
    (d / "adir.png").mkdir()
    (d / "cut.png").write_bytes(paths[0].read_bytes()[:70])
    (d / "text.png").write_text("hello")
    return d


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_is_one_line_exit_2_and_skip_bad_writes_an_error_row(tmp_path, bad_images, capsys, case):
    item, needles = BAD_CASES[case]
    good = {"image": "img0.png", "caption": "fine", "id": "first"}
    caps = write_jsonl(tmp_path / "bad.jsonl", [good, item, {"image": "img2.png", "caption": "after"}])
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--images", bad_images, "--captions", caps, "--out", out) == 2
    one_line_error(capsys, *needles)
    assert score(tmp_path, "--images", bad_images, "--captions", caps, "--out", out, "--skip-bad", "--overwrite") == 0
    got = rows(out)
    assert len(got) == 3 and got[0]["score"] is not None and got[2]["score"] is not None
    assert got[1]["score"] is None and all(n in got[1]["error"] for n in needles)
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert (summary["count"], summary["skipped"]) == (2, 1)


def test_whole_file_errors(tmp_path, data, capsys):
    paths, _, _ = data
    d = paths[0].parent
    (tmp_path / "broken.json").write_text('{"img0": "a",\n"img1": }')
    assert score(tmp_path, "--images", d, "--captions", tmp_path / "broken.json", "--out", tmp_path / "o.jsonl") == 2
    one_line_error(capsys, "broken.json:2", "malformed JSON")
    (tmp_path / "nocol.csv").write_text("image,text\nimg0.png,a\n")
    assert score(tmp_path, "--images", d, "--captions", tmp_path / "nocol.csv", "--out", tmp_path / "o.jsonl") == 2
    one_line_error(capsys, "nocol.csv:1", "missing column 'caption'")
    (tmp_path / "c.json").write_text('{"img0": "a", "ghost": "b"}')
    assert score(tmp_path, "--images", d, "--captions", tmp_path / "c.json", "--out", tmp_path / "o.jsonl",
                 quiet=False) == 2
    err = capsys.readouterr().err
    assert "c.json: id 'ghost': caption without image" in err and "Traceback" not in err
    assert score(tmp_path, "--images", d, "--captions", tmp_path / "c.json", "--metric", "refclip-s",
                 "--out", tmp_path / "p.jsonl", "--skip-bad") == 0
    assert "needs references" in rows(tmp_path / "p.jsonl")[0]["error"]


def test_refuses_to_overwrite_without_resume(tmp_path, data, capsys):
    paths, _, _ = data
    out = tmp_path / "o.jsonl"
    args = ["--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--out", out]
    assert score(tmp_path, *args) == 0
    before = out.read_bytes()
    assert score(tmp_path, *args) == 2
    one_line_error(capsys, "o.jsonl already exists", "--resume", "--overwrite")
    assert out.read_bytes() == before
    fresh = tmp_path / "fresh.csv"
    assert main(["-q", "score", "--model", "ViT-B-32-nosuch", *map(str, args[:-1]), str(fresh)]) == 2
    one_line_error(capsys, "unknown open_clip architecture 'ViT-B-32-nosuch'")
    assert not fresh.exists()  # a failed model load leaves no half-made output behind


def test_resume_after_a_real_sigkill(tmp_path, make_images):
    paths = make_images(3)
    n = 1000
    caps = write_jsonl(tmp_path / "caps.jsonl",
                       [{"image": f"img{i % 3}.png", "caption": f"a caption with number {i}"} for i in range(n)])
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "capscore.cli", "-q", "score", "--model", MODEL, "--images", str(paths[0].parent),
           "--captions", str(caps), "--out", str(out), "--chunk-size", "1", "--no-cache"]
    # chunks of one caption (one fsync each) keep the child busy long enough to be killed mid-run
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while (not out.exists() or out.stat().st_size < 2_000) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = out.read_bytes().count(b"\n")
    assert 0 < written < n, "the run was not interrupted mid-way"
    assert main(["-q", "score", "--model", MODEL, "--images", str(paths[0].parent), "--captions", str(caps),
                 "--out", str(out), "--chunk-size", "5000", "--no-cache", "--resume"]) == 0
    ids = [r["id"] for r in rows(out)]
    assert ids == [str(i) for i in range(1, n + 1)]  # nothing lost, nothing twice
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["count"] == n and summary["resumed_rows"] == written


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet"])
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, make_images, ext):
    paths = make_images(5)
    caps = write_jsonl(tmp_path / "caps.jsonl",
                       [{"image": f"img{i % 5}.png", "caption": f"caption number {i}"} for i in range(23)])
    full, part = tmp_path / f"full.{ext}", tmp_path / f"part.{ext}"
    common = ["--images", paths[0].parent, "--captions", caps, "--chunk-size", "4"]
    assert score(tmp_path, *common, "--out", full, "--no-cache") == 0
    # a killed run: 3 chunks flushed, then half of the next record
    if ext == "parquet":  # Parquet rows live in a JSONL journal until the run ends
        lines = [json.dumps(r).encode() for r in pq.read_table(full).to_pylist()]
        kept = b"\n".join(lines[:12]) + b"\n" + lines[12][:15]
        (tmp_path / "part.parquet.partial.jsonl").write_bytes(kept)
    else:
        lines = full.read_bytes().split(b"\n")
        header = 1 if ext == "csv" else 0
        kept = b"\n".join(lines[: header + 12]) + b"\n" + lines[header + 12][:15]
        part.write_bytes(kept)
    (tmp_path / f"part.{ext}.summary.json").write_text(
        (tmp_path / f"full.{ext}.summary.json").read_text().replace(f"full.{ext}", f"part.{ext}"))
    assert score(tmp_path, *common, "--out", part, "--resume", "--no-cache") == 0
    read = {"jsonl": lambda f: pd.read_json(f, lines=True, dtype={"id": str}),
            "csv": lambda f: pd.read_csv(f, dtype={"id": str}), "parquet": pd.read_parquet}[ext]
    a, b = read(full), read(part)
    assert b["id"].tolist() == [str(i) for i in range(1, 24)] == a["id"].tolist()  # none lost, none twice
    np.testing.assert_allclose(b["score"], a["score"], atol=1e-6)
    s = json.loads((tmp_path / f"part.{ext}.summary.json").read_text())
    assert (s["count"], s["resumed_rows"], s["scored_now"]) == (23, 12, 11)
    assert s["mean"] == pytest.approx(a["score"].mean(), abs=1e-6)


def test_resume_after_a_fatal_error_and_a_fix(tmp_path, make_images, capsys):
    paths = make_images(3)
    items = [{"image": f"img{i % 3}.png", "caption": f"c {i}"} for i in range(10)]
    items[7] = {"image": "img1.png", "caption": ""}
    caps = write_jsonl(tmp_path / "caps.jsonl", items)
    out = tmp_path / "o.jsonl"
    common = ["--images", paths[0].parent, "--captions", caps, "--out", out, "--chunk-size", "3"]
    assert score(tmp_path, *common) == 2
    one_line_error(capsys, "caps.jsonl:8", "empty caption")
    assert len(rows(out)) == 6  # the two chunks before the bad one are kept
    items[7]["caption"] = "c 7"
    write_jsonl(caps, items)
    assert score(tmp_path, *common, "--resume") == 0
    assert [r["id"] for r in rows(out)] == [str(i) for i in range(1, 11)]
    # resuming with other inputs is refused rather than mixing two runs
    write_jsonl(caps, [{"image": "img0.png", "caption": "x", "id": "other"}] + items)
    assert score(tmp_path, *common, "--resume") == 2
    one_line_error(capsys, "--resume", "inputs changed")
    assert score(tmp_path, *common[:-2], "--resume", "--metric", "pac-s") == 2
    one_line_error(capsys, "--resume: metric was 'clip-s'")


def test_abe_metric_dispatches_to_the_abe_scorer(tmp_path, data):
    abe = pytest.importorskip("capscore.scores.abe")
    paths, caps, _ = data
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--metric", "abe",
                 "--out", out) == 0
    from capscore.backbones import load_backbone
    from capscore.embed import Encoder

    bb = load_backbone(MODEL, seed=0)
    expected = abe.make_abe_scorer()(Encoder(bb), paths, list(caps.values()))  # ABE uses no prefix by default
    np.testing.assert_allclose([r["score"] for r in rows(out)], expected.numpy(), atol=1e-5)


def test_abe_options_reach_the_scorer(tmp_path, data, ref_model, capsys):
    """--abe-omega 1 is the global cosine (eq. 12 with ω = 1), recomputed with open_clip alone; --abe-k/-p and
    --concept-pool reach AbeConfig and the summary; ABE flags on another metric, or bad values, are errors."""
    paths, caps, _ = data
    common = ["--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--metric", "abe"]
    out = tmp_path / "o1.jsonl"
    assert score(tmp_path, *common, "--abe-omega", "1", "--out", out) == 0
    np.testing.assert_allclose([r["score"] for r in rows(out)], ref_cos(ref_model, paths, caps.values()), atol=1e-5)
    pool = tmp_path / "pool.txt"
    pool.write_text("square\ncircle\ntriangle\n")
    out2 = tmp_path / "o2.jsonl"
    assert score(tmp_path, *common, "--abe-k", "2", "--abe-p", "3", "--abe-omega", "0", "--concept-pool", pool,
                 "--out", out2) == 0
    summary = json.loads((tmp_path / "o2.jsonl.summary.json").read_text())
    assert summary["abe"] == {"k": 2, "p": 3, "omega": 0.0, "pool": str(pool.resolve())}
    from capscore.backbones import load_backbone
    from capscore.embed import Encoder
    from capscore.scores.abe import make_abe_scorer

    expected = make_abe_scorer(k=2, p=3, omega=0.0, pool=str(pool))(Encoder(load_backbone(MODEL, seed=0)), paths,
                                                                   list(caps.values()))
    np.testing.assert_allclose([r["score"] for r in rows(out2)], expected.numpy(), atol=1e-5)
    assert score(tmp_path, *common, "--abe-k", "0", "--out", tmp_path / "o3.jsonl") == 2
    one_line_error(capsys, "argument --abe-k: must be a positive integer; got 0")
    assert score(tmp_path, *common[:-2], "--abe-k", "3", "--out", tmp_path / "o4.jsonl") == 2
    one_line_error(capsys, "--abe-k/--abe-p/--abe-omega/--concept-pool apply to --metric abe only")
    assert score(tmp_path, *common, "--concept-pool", tmp_path / "nope.txt", "--out", tmp_path / "o5.jsonl") == 2
    one_line_error(capsys, "concept pool file not found")


def test_default_model_is_clip_s_backbone_and_offline_names_the_bundled_model(tmp_path, data, capsys, monkeypatch):
    """Without --model the backbone is CLIP-S's (ViT-B-32/openai); offline and uncached that is one line that
    names the bundled offline model."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    paths, _, _ = data
    argv = ["score", "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", "--out", tmp_path / "o.jsonl"]
    assert main([str(a) for a in argv]) == 2
    one_line_error(capsys, "--model ViT-B-32/openai", "--model scenes-tiny")
    assert not (tmp_path / "o.jsonl").exists()


def test_refs_without_metric_give_refclip_s_rows(tmp_path, data):
    paths, _, refs = data
    out = tmp_path / "o.jsonl"
    argv = ["-q", "score", "--model", "scenes-tiny", "--images", paths[0].parent, "--captions", tmp_path / "sysA.json",
            "--refs", tmp_path / "refs.json", "--out", out, "--cache-dir", tmp_path / "cache"]
    assert main([str(a) for a in argv]) == 0
    got = rows(out)
    assert {r["metric"] for r in got} == {"refclip-s"} and len(got) == 4
    for r in got:  # RefCLIP-S = H-mean(image part, reference part), both reported (eq. 2)
        a, b = r["image_score"], r["ref_score"]
        assert r["score"] == pytest.approx(0.0 if a + b == 0 else 2 * a * b / (a + b), abs=1e-6)


def test_refs_with_a_reference_free_metric_warn_once(tmp_path, data, capsys):
    paths, _, _ = data
    out = tmp_path / "o.jsonl"
    argv = ["score", "--model", "scenes-tiny", "--metric", "clip-s", "--images", paths[0].parent, "--captions",
            tmp_path / "sysA.json", "--refs", tmp_path / "refs.json", "--out", out, "--cache-dir", tmp_path / "cache",
            "--chunk-size", "1"]
    assert main([str(a) for a in argv]) == 0
    err = capsys.readouterr().err
    assert err.count("ignores the references") == 1, err


def test_several_systems_get_paired_tests_in_the_summary(tmp_path, data, capsys):
    """Two caption files = two systems: the summary holds the paired bootstrap and randomisation tests between
    them, captions paired by id and images as clusters, and prints them."""
    from capscore.meta.significance import approximate_randomization, paired_bootstrap

    paths, _, _ = data
    out = tmp_path / "o.jsonl"
    assert score(tmp_path, "--images", paths[0].parent, "--captions", tmp_path / "sysA.json", tmp_path / "sysB.json",
                 "--out", out) == 0
    assert "paired tests between systems" in capsys.readouterr().out
    (t,) = json.loads((tmp_path / "o.jsonl.summary.json").read_text())["system_tests"]
    got = rows(out)
    a = {r["id"]: r["score"] for r in got if r["system"] == "sysA"}
    b = {r["id"]: r["score"] for r in got if r["system"] == "sysB"}
    ids = sorted(a)
    assert (t["a"], t["b"], t["paired"]) == ("sysA", "sysB", 4)
    boot, ar = t["tests"]
    assert boot["delta"] == pytest.approx(np.mean([a[i] - b[i] for i in ids]), abs=1e-9)
    expect = paired_bootstrap([a[i] for i in ids], [b[i] for i in ids], clusters=ids, n_resamples=1000, seed=0)
    assert boot["p_value"] == pytest.approx(expect.p_value) and boot["ci"] == pytest.approx(list(expect.ci))
    expect = approximate_randomization([a[i] for i in ids], [b[i] for i in ids], clusters=ids, n_resamples=1000)
    assert ar["p_value"] == pytest.approx(expect.p_value)
