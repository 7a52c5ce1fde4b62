"""`capscore score --videos` and `capscore scenes generate --videos` end to end on capscore-test-tiny.

Expected values are recomputed with open_clip alone (same random init as the fixture: seed 0)
from the frames the test wrote (lossless codec, so decoded = written).
"""
import json
from fractions import Fraction

import av
import numpy as np
import open_clip
import pandas as pd
import pytest
import torch
from PIL import Image

import capscore.backbones.openclip  # noqa: F401  (registers capscore-test-tiny with open_clip)
from capscore.cli import main

MODEL = "capscore-test-tiny"


@pytest.fixture(scope="module")
def ref_model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model, _, preprocess = open_clip.create_model_and_transforms(MODEL, pretrained=None)
    return model.eval(), preprocess, open_clip.get_tokenizer(MODEL)


def write_mp4(path, frames, fps=8):
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264rgb", rate=Fraction(fps))
        s.width, s.height, s.pix_fmt, s.options = frames[0].shape[1], frames[0].shape[0], "rgb24", {"crf": "0"}
        for a in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@pytest.fixture
def clips(tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "videos"
    d.mkdir()
    frames = {}
    for name in ("cat", "dog"):
        frames[name] = [(rng.random((32, 32, 3)) * 255).astype("uint8") for _ in range(4)]
        write_mp4(d / f"{name}.mp4", frames[name])
    caps = [{"image": "cat", "caption": "a cat jumps", "id": "c1", "refs": ["a cat leaps", "an animal"]},
            {"image": "cat", "caption": "a dog runs", "id": "c2", "refs": ["a cat leaps"]},
            {"image": "dog", "caption": "a dog runs", "id": "d1", "refs": ["a dog is running"]}]
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    return d, frames, caps


def run(tmp_path, *args):
    return main(["-q", "score", "--model", MODEL, "--cache-dir", str(tmp_path / "cache"), *map(str, args)])


def test_video_clip_s_and_pac_s_against_open_clip(tmp_path, clips, ref_model, capsys):
    d, frames, caps = clips
    model, pre, tok = ref_model
    out = tmp_path / "o.jsonl"
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "caps.jsonl", "--metric", "clip-s",
               "--frames", "all", "--out", out) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    with torch.no_grad():
        for row, cap in zip(rows, caps):
            f = model.encode_image(torch.stack([pre(Image.fromarray(a)) for a in frames[cap["image"]]]))
            v = torch.nn.functional.normalize(torch.nn.functional.normalize(f, dim=-1).mean(0), dim=-1)
            t = torch.nn.functional.normalize(model.encode_text(tok([cap["caption"]]))[0], dim=-1)
            assert row["score"] == pytest.approx(2.5 * max(float(v @ t), 0), abs=1e-5)
            assert row["coarse"] == pytest.approx(float(v @ t), abs=1e-5)
            assert row["video"].endswith(f"{cap['image']}.mp4") and row["error"] is None
    out2 = tmp_path / "o.csv"
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "caps.jsonl", "--metric", "pac-s",
               "--frames", "all", "--out", out2) == 0
    df = pd.read_csv(out2)
    np.testing.assert_allclose(df["coarse"], [r["coarse"] for r in rows], atol=1e-5)  # same mean-frame cosine
    p, r = df["fine_p"].to_numpy(), df["fine_r"].to_numpy()
    np.testing.assert_allclose(df["fine_f"], 2 * p * r / (p + r), atol=1e-6)
    np.testing.assert_allclose(df["score"], (df["fine_f"] + df["coarse"]) / 2, atol=1e-6)
    summary = json.loads((tmp_path / "o.csv.summary.json").read_text())
    # three captions, two clips: each clip decoded and encoded once (the first run cached them)
    assert summary["videos_cached"] == 2 and summary["frames_encoded"] == 0 and summary["frames"] == "all"
    assert summary["count"] == 3 and summary["mean"] == pytest.approx(df["score"].mean())


def test_refpac_s_needs_refs_and_uses_them(tmp_path, clips, capsys):
    d, _, _ = clips
    out = tmp_path / "o.jsonl"
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "caps.jsonl", "--metric", "refpac-s",
               "--out", out) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    for row in rows:  # RefPAC-S = (PAC-S + (ref fine F + ref coarse)/2) / 2
        pac = (row["fine_f"] + row["coarse"]) / 2
        assert row["score"] == pytest.approx((pac + (row["ref_fine_f"] + row["ref_coarse"]) / 2) / 2, abs=1e-6)
    (tmp_path / "norefs.jsonl").write_text(json.dumps({"image": "cat", "caption": "x"}) + "\n")
    capsys.readouterr()
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "norefs.jsonl", "--metric", "refpac-s",
               "--out", tmp_path / "n.jsonl") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capscore: error: ") and "needs references" in err and "\n" not in err


def test_bad_video_error_row_with_skip_bad_else_one_line(tmp_path, clips, capsys):
    d, _, caps = clips
    (d / "broken.mp4").write_bytes(b"\x00" * 300)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps)
                                      + json.dumps({"image": "broken", "caption": "a thing", "id": "b"}) + "\n"
                                      + json.dumps({"image": "nothere", "caption": "a thing", "id": "n"}) + "\n")
    out = tmp_path / "o.jsonl"
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "c.jsonl", "--metric", "pac-s", "--skip-bad",
               "--out", out) == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["b"]["score"] is None and "broken.mp4" in rows["b"]["error"] and "decode" in rows["b"]["error"]
    assert rows["n"]["score"] is None and "nothere" in rows["n"]["error"]
    assert all(rows[k]["score"] is not None for k in ("c1", "c2", "d1"))
    capsys.readouterr()
    assert run(tmp_path, "--videos", d, "--captions", tmp_path / "c.jsonl", "--metric", "pac-s",
               "--out", tmp_path / "o2.jsonl") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capscore: error: ") and "broken.mp4" in err and "\n" not in err and "Traceback" not in err
    # metric names that only exist for videos are refused for images, and vice versa
    assert main(["-q", "score", "--images", str(d), "--captions", str(tmp_path / "c.jsonl"), "--metric", "emscore",
                 "--out", str(tmp_path / "x.jsonl")]) == 2


def test_resume_equals_uninterrupted_run(tmp_path, clips):
    d, _, _ = clips
    caps = [{"image": ["cat", "dog"][i % 2], "caption": f"caption {i}", "id": str(i)} for i in range(9)]
    (tmp_path / "many.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    full, part = tmp_path / "full.csv", tmp_path / "part.csv"
    common = ["--videos", d, "--captions", tmp_path / "many.jsonl", "--metric", "pac-s", "--chunk-size", "2"]
    assert run(tmp_path, *common, "--out", full) == 0
    lines = full.read_bytes().split(b"\n")
    part.write_bytes(b"\n".join(lines[:5]) + b"\n" + lines[5][:20])  # 4 rows, then half of the fifth
    assert run(tmp_path, *common, "--out", part, "--resume") == 0
    a, b = pd.read_csv(full), pd.read_csv(part)
    assert a["id"].tolist() == b["id"].tolist() == list(range(9))
    np.testing.assert_allclose(a["score"], b["score"], atol=1e-7)
    assert json.loads((tmp_path / "part.csv.summary.json").read_text())["resumed_rows"] == 4


def test_scenes_generate_videos_writes_lossless_mp4_and_graded_captions(tmp_path):
    from capscore.scenes import generate_scenes

    out = tmp_path / "sv"
    assert main(["-q", "scenes", "generate", "--videos", "--n", "2", "--frames", "5", "--size", "64",
                 "--out", str(out)]) == 0
    scenes = generate_scenes(2, seed=0, split="all")
    for s in scenes:
        clip = s.frames(5)
        with av.open(str(out / "videos" / f"{s.id}.mp4")) as c:
            got = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(got) == 5 and all(np.array_equal(g, np.asarray(f)) for g, f in zip(got, clip.frames))
    rows = [json.loads(x) for x in (out / "captions.jsonl").read_text().splitlines()]
    by = {(r["image"], r["system"]): r for r in rows}
    for s in scenes:
        correct, wrong = by[(s.id, "correct")], by[(s.id, "direction")]
        assert correct["oracle_precision"] == 1.0 and wrong["oracle_precision"] < 1.0  # one false motion claim
        assert "moves" in correct["caption"] and correct["refs"][0].startswith("In this clip")
    # and the output feeds `capscore score --videos` directly
    assert run(tmp_path, "--videos", out / "videos", "--captions", out / "captions.jsonl", "--metric", "refpac-s",
               "--out", tmp_path / "s.jsonl") == 0
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == len(rows)
