"""VATEX-EVAL and ActivityNet-FOIL loaders on small files in their published (EMScore release) layouts,
their protocols, and `capscore correlate` on them."""
import json
import os
import pickle
from fractions import Fraction

import av
import numpy as np
import pytest
from scipy import stats

from capscore.cli import main
from capscore.errors import InputError
from capscore.meta.video import evaluate_video, load_activitynet_foil, load_vatex_eval, overlapping_refs

MODEL = "capscore-test-tiny"


def write_mp4(path, n=8, fps=4, seed=0):
    rng = np.random.default_rng(seed)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264rgb", rate=Fraction(fps))
        s.width, s.height, s.pix_fmt, s.options = 32, 32, "rgb24", {"crf": "0"}
        for _ in range(n):
            a = (rng.random((32, 32, 3)) * 255).astype("uint8")
            for p in s.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


@pytest.fixture
def vatex(tmp_path):
    root, vids = tmp_path / "VATEX-EVAL", tmp_path / "vatex_videos"
    root.mkdir()
    vids.mkdir()
    for k, v in enumerate(("vidA_000010_000020", "vidB_000001_000011")):
        write_mp4(vids / f"{v}.mp4", seed=k)
    cands = np.array(["a man plays a guitar", "a woman is cooking", "someone is dancing", "a dog runs fast",
                      "a man sings", "people are walking"], dtype=object)
    gts = np.array([[f"reference {j} of video {i % 2}" for j in range(9)] for i in range(6)], dtype=object)
    human = np.array([1, 2, 3, 4, 5, 2,  2, 2, 3, 5, 4, 1,  1, 3, 3, 4, 5, 3], dtype=float)  # annotator-major
    ids = np.array(["vidA_000010_000020", "vidB_000001_000011"] * 3)
    for name, arr in (("candidates_list", cands), ("gts_list", gts), ("human_scores", human), ("video_ids", ids)):
        with open(root / f"{name}.pkl", "wb") as f:
            pickle.dump(arr, f)
    return root, vids, cands, human


def test_vatex_eval_loader_reads_the_pickled_layout(vatex):
    root, vids, cands, human = vatex
    ds = load_vatex_eval(root, vids)
    assert len(ds) == 6 and [r.caption for r in ds.items] == list(cands)
    assert ds.humans.shape == (6, 3)
    assert ds.humans[1].tolist() == [2, 2, 3]  # item 1: the second score of each annotator's block
    assert len(ds.items[0].refs) == 9 and ds.items[3].image.path.name == "vidB_000001_000011.mp4"


def test_vatex_pickles_that_are_not_numpy_arrays_are_refused(vatex):
    root, vids, _, _ = vatex

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(root / "gts_list.pkl", "wb") as f:
        pickle.dump(Evil(), f)
    with pytest.raises(InputError, match="refusing to load"):
        load_vatex_eval(root, vids)


def test_vatex_correlate_follows_the_protocol(tmp_path, vatex):
    root, vids, cands, human = vatex
    out = tmp_path / "res"
    assert main(["-q", "correlate", "--dataset", "vatex-eval", "--path", str(root), "--videos", str(vids),
                 "--model", MODEL, "--metric", "pac-s", "refpac-s", "--bootstrap", "0", "--no-cache",
                 "--out", str(out)]) == 0
    res = json.loads((out / "correlate.json").read_text())["results"]
    got = {r["metric"]: {s["name"]: s["value"] for s in r["stats"]} for r in res}
    assert set(got["pac-s"]) == {"0-ref tau_b", "0-ref spearman"}
    assert set(got["refpac-s"]) == {"1-ref tau_b", "1-ref spearman", "9-ref tau_b", "9-ref spearman"}
    # the same candidates scored by `capscore score --videos` and correlated here with scipy, annotator by annotator
    (tmp_path / "c.jsonl").write_text("".join(
        json.dumps({"image": ["vidA_000010_000020", "vidB_000001_000011"][i % 2], "caption": c, "id": str(i)}) + "\n"
        for i, c in enumerate(cands)))
    assert main(["-q", "score", "--model", MODEL, "--no-cache", "--videos", str(vids), "--captions",
                 str(tmp_path / "c.jsonl"), "--metric", "pac-s", "--out", str(tmp_path / "s.jsonl")]) == 0
    x = np.round([json.loads(line)["score"] for line in (tmp_path / "s.jsonl").read_text().splitlines()], 4)
    h = human.reshape(3, -1).T
    tau = np.mean([stats.kendalltau(x, h[:, j]).statistic for j in range(3)])
    rho = np.mean([stats.spearmanr(x, h[:, j]).statistic for j in range(3)])
    assert got["pac-s"]["0-ref tau_b"] == pytest.approx(100 * tau, abs=1e-6)
    assert got["pac-s"]["0-ref spearman"] == pytest.approx(100 * rho, abs=1e-6)


def test_activitynet_reference_overlap_rule():
    # segment [0, 5] = seconds {0..5}; a reference counts when > 40% of its own seconds fall inside
    assert overlapping_refs([0, 5.9], [[0, 3], [4, 10], [20, 30]]) == [0]      # 4/4, 2/7, 0/11
    assert overlapping_refs([0, 5], [[3, 6]]) == [0]                              # 3/4
    assert overlapping_refs([0, 5], [[4, 8]]) == [0]                              # none > 40%: all (2/5 = 0.4)
    assert overlapping_refs([0, 5], [[4, 8], [5, 6]]) == [1]                      # 2/5 no, 1/2 yes


@pytest.fixture
def anet(tmp_path):
    root, vids = tmp_path / "anet", tmp_path / "anet_videos"
    root.mkdir()
    vids.mkdir()
    write_mp4(vids / "v_one.mp4", n=16, fps=4, seed=1)   # 4 s
    write_mp4(vids / "v_two.mp4", n=12, fps=4, seed=2)   # 3 s
    seg = {"v_one": {"duration": 4.0, "timestamps": [[0, 2], [2, 4]], "sentences": ["x", "y"]},
           "v_two": {"duration": 3.0, "timestamps": [[0, 1.5], [1.5, 3]], "sentences": ["x", "y"]},
           "v_gone": {"duration": 3.0, "timestamps": [[0, 3]], "sentences": ["x"]}}
    refs = {"v_one": {"duration": 4.0, "timestamps": [[0, 2], [2, 4]], "sentences": ["a man opens a door ", " he walks in"]},
            "v_two": {"duration": 3.0, "timestamps": [[0, 3]], "sentences": ["a girl rides a bike"]},
            "v_gone": {"duration": 3.0, "timestamps": [[0, 3]], "sentences": ["nothing"]}}
    right = {"results": {"v_one": [{"sentence": "a man opens a door"}, {"sentence": "he walks in"}],
                         "v_two": [{"sentence": "a girl rides a bike"}, {"sentence": "she stops"}],
                         "v_gone": [{"sentence": "gone"}]}}
    foil = {"results": {"v_one": [{"sentence": "a woman opens a door"}, {"sentence": "he walks in"}],
                        "v_two": [{"sentence": "a girl rides a horse"}, {"sentence": "she stops"}],
                        "v_gone": [{"sentence": "gone too"}]}}
    for name, obj in (("anet_entities_test_1", seg), ("anet_entities_test_2", refs),
                      ("final_right_video_sentences", right), ("final_foil_video_sentences", foil)):
        (root / f"{name}.json").write_text(json.dumps(obj))
    return root, vids


def test_activitynet_foil_loader_and_accuracy(anet, tiny_backbone):
    from capscore.embed import Encoder
    from capscore.pipeline import score_all

    root, vids = anet
    ds = load_activitynet_foil(root, vids)
    assert [v.id for v in ds.items] == ["v_one", "v_two"] and ds.skipped == {"video not in --videos": 1}
    one = ds.items[0]
    assert [r.caption for r in one.right] == ["a man opens a door", "he walks in"]
    assert one.foil[0].caption == "a woman opens a door"
    assert (one.right[1].image.start, one.right[1].image.end) == (2.0, 4.0)
    assert one.right[0].refs == ("a man opens a door",) and one.right[1].refs == ("he walks in",)
    assert ds.items[1].right[1].refs == ("a girl rides a bike",)
    enc = Encoder(tiny_backbone)
    res = evaluate_video(ds, enc, "refpac-s", sampling="all")
    # by hand from the per-segment scores: a video is right when its mean right score beats the mean foil score
    rows = {r["id"]: r["score"] for r in score_all([r for v in ds.items for r in v.right + v.foil], enc,
                                                   "refpac-s", medium="video", options={"sampling": "all"})}
    wins = [np.mean([rows[r.id] for r in v.right]) > np.mean([rows[r.id] for r in v.foil]) for v in ds.items]
    assert res.value("accuracy") == pytest.approx(100 * np.mean(wins)) and res.n == 2
    # segment windows change what is encoded: 2 s at 4 fps = 8 frames per segment, 4 segment windows
    assert enc.stats.frames_encoded == 8 + 8 + 6 + 6


def test_missing_files_are_one_line_errors(tmp_path, capsys):
    assert main(["-q", "correlate", "--dataset", "vatex-eval", "--path", str(tmp_path), "--videos", str(tmp_path),
                 "--model", MODEL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("capscore: error: ") and "candidates_list.pkl not found" in err and "\n" not in err
