"""`capscore reproduce` / `doctor` offline: every shipped row's protocol runs end to end on fixtures written in
each dataset's published layout, with a random-weights CLIP standing in for the paper's weights. No paper
number is asserted as reproduced (that needs the real weights and data)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from capscore.meta import reproduce as R

pytest.importorskip("pycocoevalcap")

CAPTIONS = ["a dog runs on the grass", "a red car parked on a street", "two people walking on a beach",
            "a cat sleeping on a sofa", "a plane flying in the sky", "a man riding a horse in a field"]


def _img(path, seed):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)


def _flickr(root, name):
    data = {}
    rng = np.random.default_rng(len(name))
    for k in range(6):
        key = f"{1000 + k}_abc"
        rel = f"Flicker8k_Dataset/{key}.jpg"
        _img(root / "flickr8k" / rel, k)
        refs = [CAPTIONS[k], f"{CAPTIONS[k]} today", f"there is {CAPTIONS[k]}"]
        judg = [{"image_id": key, "image_path": rel, "caption": CAPTIONS[(k + j) % 6],
                 "rating": float(rng.integers(1, 5)) if name == "flickr8k.json" else float(rng.random())}
                for j in range(3)]
        data[key] = {"image_id": key, "image_path": rel, "ground_truth": refs, "human_judgement": judg}
    (root / "flickr8k" / name).write_text(json.dumps(data))


def _composite(root):
    lines = ["imgid,cand,refs,score"]
    rng = np.random.default_rng(5)
    for k in range(12):
        _img(root / "composite" / f"img{k}.jpg", 20 + k)
        refs = json.dumps([CAPTIONS[k % 6], f"{CAPTIONS[k % 6]} again"]).replace('"', '""')
        lines.append(f'img{k}.jpg,{CAPTIONS[(k * 5) % 6]},"{refs}",{rng.integers(1, 6)}')
    (root / "composite" / "composite.csv").write_text("\n".join(lines) + "\n")


def _pascal(root):
    from scipy.io import savemat

    folder = root / "pascal50s"
    folder.mkdir(parents=True)
    pairs = [(f"2008_{i:06d}.jpg", CAPTIONS[i % 6], CAPTIONS[(i + 1) % 6], i % 4 + 1) for i in range(8)]
    n = len(pairs)
    new_input = np.zeros((1, n), dtype=[("image", object), ("a", object), ("b", object)])
    trip = np.zeros((1, 48 * n), dtype=[("ref", object), ("c1", object), ("c2", object), ("win", object)])
    cell = lambda s: np.array([[s]], dtype=object)  # noqa: E731
    for i, (img, a, b, _) in enumerate(pairs):
        _img(folder / "JPEGImages" / img, 40 + i)
        new_input[0, i] = (img, a, b)
        for j in range(48):
            trip[0, 48 * i + j] = (cell(f"{CAPTIONS[(i + j) % 6]} number {j}"), cell(a), cell(b),
                                   np.array([[1.0 if j < 30 else -1.0]]))
    savemat(folder / "pair_pascal.mat", {"new_input": new_input, "category": np.array([[p[3] for p in pairs]], float)})
    savemat(folder / "consensus_pascal.mat", {"triplets": trip})


def _foil(root):
    anns, coco = [], []
    for k in range(6):
        _img(root / "coco" / "val2014" / f"COCO_val2014_{k:012d}.jpg", 60 + k)
        anns.append({"id": k, "image_id": k, "caption": CAPTIONS[k], "foil": False})
        anns.append({"id": k, "image_id": k, "caption": CAPTIONS[k].replace("a ", "an elephant ", 1), "foil": True})
        coco += [{"image_id": k, "id": 10 * k + j, "caption": f"{CAPTIONS[k]} {w}"}
                 for j, w in enumerate(["", "here", "now", "there", "again"])]
    (root / "foil").mkdir(parents=True)
    (root / "foil" / "foilv1.0_test_2017.json").write_text(json.dumps({"images": [], "annotations": anns}))
    (root / "coco" / "annotations").mkdir(parents=True)
    (root / "coco" / "annotations" / "captions_val2014.json").write_text(json.dumps({"images": [], "annotations": coco}))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    _flickr(root, "flickr8k.json")
    _flickr(root, "crowdflower_flickr8k.json")
    _composite(root)
    _pascal(root)
    _foil(root)
    _judgment_csv(root, "polaris", "polaris_test.csv")
    _judgment_csv(root, "nebula", "nebula_test.csv")
    return root


def _rows_runnable():
    rows = [r for t in R.table_names() for r in R.read_table(t)]
    keep = [r for r in rows if not R.missing_tools(r.metric) and r.metric not in R.NOT_REGISTERED
            and r.metric not in JUDGES]  # a random-weight judge writes no readable number: no correlation
    return rows, keep


JUDGES = ("fleur", "reffleur", "expert")


def _judgment_csv(root, name, file, n=12):
    """Polaris / Nebula in the authors' CSV layout (mt, refs, score, imgid; images/imgid)."""
    rng = np.random.default_rng(len(name))
    lines = ["mt,refs,score,imgid"]
    for k in range(n):
        _img(root / name / "images" / f"{k:03d}.jpg", 80 + k)
        refs = str([CAPTIONS[k % 6], f"{CAPTIONS[k % 6]} again"]).replace('"', '""')
        lines.append(f'{CAPTIONS[(k * 5) % 6]},"{refs}",{rng.random():.3f},{k:03d}.jpg')
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / file).write_text("\n".join(lines) + "\n")


def test_every_table_is_listed_and_well_formed():
    from capscore.meta.datasets import DATASETS
    from capscore.scores.classic import CLASSIC_METRICS
    from capscore.scores.metric import get_metric

    names = R.table_names()
    assert {"pac-s-flickr8k", "pac-s-composite", "pac-s-pascal50s", "pac-s-foil", "pac-s-backbones",
            "clipscore-2021"} <= set(names)
    for t in names:
        for r in R.read_table(t):
            assert r.dataset in DATASETS and r.dataset in R.DATA_LAYOUT
            if r.metric in R.NOT_REGISTERED or r.metric in ("polos", "deneb", "fleur", "reffleur", "expert"):
                assert r.model == "-", r  # their weights come from the metric's own files (--metric-weights)
            elif r.metric not in CLASSIC_METRICS:
                get_metric(r.metric)  # raises on an unknown metric
                assert R.weights_file(r.model, R.Path("/w")) is not None, r
            assert r.tolerance > 0 and r.source


@pytest.mark.slow  # one JVM start per classic metric and reference draw (METEOR loads its paraphrase table each time)
def test_every_row_protocol_runs_and_wrong_values_are_flagged(data_root, tmp_path):
    rows, runnable = _rows_runnable()
    models = {r.model for r in rows if r.model != "-"}
    from learned_weights import weights_dir  # Polos' rows on its released layout with random tensors

    results = R.run_table(runnable, data_root=data_root, weights_root=tmp_path / "no-weights", batch_size=16,
                          model_override={m: "capscore-test-tiny" for m in models},
                          metric_weights=weights_dir(tmp_path / "metric-weights"))
    assert len(results) == len(runnable) and any(r.metric == "polos" for r in runnable)
    assert [r.skipped for r in results if r.skipped] == []
    for res in results:
        assert res.ours is not None and np.isfinite(res.ours), res.row
    # the comparison: a paper value equal to ours is within tolerance, one off by more than it is flagged
    res = results[0]
    right = R.RowResult(R.PaperRow(**{**res.row.__dict__, "paper": res.ours}), res.ours)
    wrong = R.RowResult(R.PaperRow(**{**res.row.__dict__, "paper": res.ours + 3 * res.row.tolerance}), res.ours)
    assert right.within is True and wrong.within is False and wrong.delta == pytest.approx(-3 * res.row.tolerance)
    text = R.format_results([right, wrong])
    assert "1 of 2 rows within tolerance" in text and "NO" in text


def test_absent_weights_and_data_are_skipped_one_line_each(data_root, tmp_path, capsys):
    from capscore.cli import main

    # every row skipped: nothing was reproduced, so the command fails (exit 2, one line) after saying why
    assert main(["reproduce", "clipscore-2021", "--data-root", str(data_root), "--weights-root", str(tmp_path),
                 "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    skipped = [ln for ln in out.splitlines() if ln.startswith("skipped ")]
    assert len(skipped) == 10 and all("weights not found" in ln for ln in skipped)
    assert err.count("\n") == 1 and "no row of clipscore-2021 could be run (weights not found" in err
    got = json.loads((tmp_path / "out" / "reproduce.json").read_text())
    assert len(got["rows"]) == 10 and all(r["ours"] is None for r in got["rows"])
    assert main(["reproduce", "pac-s-composite", "--data-root", str(tmp_path / "empty")]) == 2
    assert "data not found" in capsys.readouterr().out


def test_list_and_doctor_run_offline(data_root, tmp_path, capsys):
    from capscore.cli import main

    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for t in R.table_names():
        assert t in out
    assert "RefPAC-S" in out or "refpac-s" in out
    assert main(["doctor", "--data-root", str(data_root), "--weights-root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "flickr8k-expert" in out and "present" in out and "MISSING" in out and "GPU" in out
    assert ("java" in out) and ("CoreNLP" in out)
    assert main(["reproduce", "no-such-table"]) == 2
    assert "unknown reproduction table" in capsys.readouterr().err


def test_without_java_classic_rows_are_skipped(monkeypatch):
    from capscore.scores import classic

    monkeypatch.setattr(classic.shutil, "which", lambda name: None)
    assert "Java not found" in R.missing_tools("bleu4")
    assert R.missing_tools("clip-s") == ""


# ------------------------------------------------------------------------------------ the published rows
def test_published_rows_are_listed_with_their_sources(capsys):
    from capscore.cli import main

    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("polos-2024", "deneb-2024", "fleur-2024", "expert-2025", "vela-2025", "arxiv-2512-21582",
                 "pacscore-readme", "polaris-classic", "pac-s-pp-2025"):
        assert name in out
    for source in ("Polos CVPR 2024 Table 1, rounded reported Polos value for Polaris",
                   "EXPERT ACL 2025 Findings Table 2, EXPERT row", "Lee et al. 2024 FLEUR Table 1",
                   "Matsuda et al. 2025 VELA Table 1 and Appendix D Table 4, LongCap-Arena TestB Fluency",
                   "PACScore README correlation output for Flickr8k-Expert"):
        assert source in out
    assert "longcap-arena dci_test.flu" in out


def _value(table, dataset, metric, statistic):
    return [r.paper for r in R.read_table(table) if (r.dataset, r.metric, r.statistic) == (dataset, metric, statistic)]


def test_paper_and_code_values_are_both_rows():
    """ROUGE-L on Flickr8k-Expert, τ-b: 31.1 in the PAC-S paper, 32.1 printed by the pacscore code; BLEU-4 on
    Flickr8k-CF, τ-b: 16.9 printed by the pacscore code, 16.4 in arXiv:2512.21582 Table 1."""
    assert _value("pac-s-flickr8k", "flickr8k-expert", "rouge-l", "tau_b") == [31.1]
    assert _value("pacscore-readme", "flickr8k-expert", "rouge-l", "tau_b") == [32.1]
    assert _value("pacscore-readme", "flickr8k-cf", "bleu4", "tau_b") == [16.9]
    assert _value("arxiv-2512-21582", "flickr8k-cf", "bleu4", "tau_b") == [16.4]
    assert _value("polos-2024", "polaris", "polos", "tau_c") == [57.8]
    assert _value("expert-2025", "flickr8k-expert", "expert", "tau_c") == [56.7]
    assert _value("fleur-2024", "flickr8k-expert", "fleur", "tau_c") == [53.0]
    assert _value("arxiv-2512-21582", "nebula", "polos", "tau_c") == [55.0]
    assert sum(len(R.read_table(t)) for t in ("polos-2024", "deneb-2024", "fleur-2024", "expert-2025", "vela-2025",
                                              "arxiv-2512-21582", "pacscore-readme", "polaris-classic",
                                              "pac-s-pp-2025")) == 109  # the 108 reference values + 16.4


def test_learned_rows_are_skipped_with_the_reason(data_root, tmp_path):
    rows = R.read_table("fleur-2024") + R.read_table("vela-2025")[:1] + R.read_table("polos-2024")
    results = R.run_table(rows, data_root=data_root, weights_root=tmp_path, metric_weights=tmp_path / "none")
    why = {r.row.metric: r.skipped for r in results if r.skipped}
    assert why["fleur"] == f"fleur: {tmp_path / 'none' / 'llava-1.5-13b-hf' / 'config.json'} not found (its LLaVA " \
                           "model folder; see docs/learned.md)"
    assert why["polos"].startswith(f"polos: {tmp_path / 'none' / 'polos' / 'reprod.ckpt'} not found")
    assert "https://polos-polaris.s3.ap-northeast-1.amazonaws.com/reprod.zip" in why["polos"]
    assert "no VELA implementation" in why["vela"]


def test_rows_on_polaris_and_nebula_run_on_the_published_csv_layout(data_root, tmp_path):
    rows = [r for r in R.read_table("polos-2024") + R.read_table("deneb-2024") if r.metric == "refclip-s"]
    assert {r.dataset for r in rows} == {"polaris", "nebula"}
    results = R.run_table(rows, data_root=data_root, weights_root=tmp_path / "none", batch_size=16,
                          model_override={r.model: "capscore-test-tiny" for r in rows})
    assert all(r.skipped == "" and np.isfinite(r.ours) for r in results)


def test_a_row_whose_correlation_is_undefined_is_skipped_with_the_reason_and_the_next_row_runs(data_root, tmp_path):
    """A metric scoring every caption alike has no correlation with the ratings: its row says why, the
    table goes on to the next row."""
    import dataclasses

    from capscore.scores.metric import METRICS, Metric, Values, register

    class Constant:
        needs, columns = frozenset({"global"}), ()

        def compute(self, batch):
            return Values([0.5] * len(batch))

    rows = [r for r in R.read_table("polos-2024") if r.metric == "refclip-s"][:1]
    register(Metric("constant-test", "a test metric", image=Constant(), prefix=""))
    try:
        results = R.run_table([dataclasses.replace(rows[0], metric="constant-test"), rows[0]], data_root=data_root,
                              weights_root=tmp_path / "none", batch_size=16,
                              model_override={rows[0].model: "capscore-test-tiny"})
    finally:
        del METRICS["constant-test"]
    assert results[0].ours is None and results[0].skipped.startswith("not computed: ")
    assert "metric scores are constant (all 0.5): a correlation is undefined" in results[0].skipped
    assert results[1].skipped == "" and np.isfinite(results[1].ours)
