"""The classic metrics in every face: the headline is pycocoevalcap's corpus score, text metrics need no image or
model, and bad input is one line (docs/classic.md, docs/score.md).

Every expected headline is pycocoevalcap's ``compute_score`` called directly on the same set (tests/classic_sets.py's
``pycoco_direct``), never capscore's own numbers: on the example fixture (the values pycocoevalcap prints), on a
1,000+ caption set, and on a run of several systems (each its own evaluated set, as pycocoevalcap scores one results
file), through the CLI, ``capscore.score`` and ``CaptionScore``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from classic_sets import coco_like, ptb_direct, pycoco_direct, session  # noqa: F401  (session: a fixture)
from test_classic_engine import fake_java  # noqa: F401  (a fixture)

from capscore.cli import main
from capscore.scores import classic

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="no Java (PTB tokenizer, METEOR)")
pytest.importorskip("pycocoevalcap")

FIVE = ["bleu1", "bleu4", "meteor", "rouge-l", "cider"]
ALL = ["bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge-l", "cider"]
EXAMPLE = json.loads((Path(__file__).parent / "fixtures" / "classic_example.json").read_text())
PRINTED = EXAMPLE["pycocoevalcap"]  # what pycocoevalcap prints for the fixture, 4 decimals
PACSCORE_README = {"good_captions": [0.6400, 0.3503, 0.3057, 0.5012, 1.4918],  # pacscore's README, as printed
                   "bad_captions": [0.4500, 0.0000, 0.0995, 0.3268, 0.4259]}


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def cli(*args, quiet: bool = True) -> int:
    return main((["-q"] if quiet else []) + [str(a) for a in args])


def one_line_error(capsys, *parts: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("capscore: error: ") and "\n" not in err and "Traceback" not in err, err
    for p in parts:
        assert p in err, (p, err)
    return err


def headlines(summary: dict, system: str | None = None) -> dict[str, float]:
    """metric -> the headline a score summary records (of one system, or of the whole run)."""
    runs = summary.get("runs") or [summary]
    return {r["metric"]: r["aggregate"]["value"] if system is None else r["aggregate"]["systems"][system]
            for r in runs}


def direct(cands, refs, names) -> dict[str, float]:
    """pycocoevalcap's headline of each metric, called as the COCO evaluation calls it."""
    return {m: v[0] for m, v in pycoco_direct(*ptb_direct(cands, refs), names=names).items()}


# ------------------------------------------------------------------------------------ the example
@pytest.mark.parametrize("which", ["good_captions", "bad_captions"])
def test_the_example_prints_and_records_pycocoevalcaps_numbers_without_a_model(which, tmp_path, capsys,
                                                                              session):  # noqa: F811
    """The issue's command on tests/fixtures/classic_example.json (laid out as the pacscore example), with
    images but no --model."""
    images = tmp_path / "images"
    images.mkdir()
    from PIL import Image

    for k in EXAMPLE["refs"]:
        Image.new("RGB", (8, 8)).save(images / f"{k}.jpg")
    caps = write(tmp_path / f"{which}.json", EXAMPLE[which])
    refs = write(tmp_path / "refs.json", EXAMPLE["refs"])
    out = tmp_path / "o.jsonl"
    assert cli("score", "--images", images, "--captions", caps, "--refs", refs, "--metric", *FIVE, "--out", out) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    ids = list(EXAMPLE["refs"])
    want = direct([EXAMPLE[which][i] for i in ids], [EXAMPLE["refs"][i] for i in ids], FIVE)
    got = headlines(summary)
    for m, printed_value in zip(FIVE, PRINTED[which]):
        assert got[m] == pytest.approx(want[m], abs=1e-12)
        assert round(got[m], 4) == pytest.approx(printed_value, abs=1e-12)
        assert f"{m} (text only): 2 scored, 0 skipped, headline " in printed and f"{printed_value:.4f}" in printed
    assert "mean sentence-level BLEU-4" in printed and "mean segment-level METEOR" in printed
    # no model, no backbone: in the summary, its runs and every row
    assert summary["model"] is None and summary["backbone"] is None and summary["status"] == "complete"
    assert all(r["model"] is None and r["backbone"] is None for r in summary["runs"])
    assert summary["classic_backend"] == "native" and summary["tokenizer"] == "ptb"
    assert "pycocoevalcap" in summary["text_metrics"]
    got_rows = rows(out)
    assert {r["model"] for r in got_rows} == {None}
    # the rows keep the per-caption values (sentence-level BLEU) and, for BLEU/METEOR, their statistics
    per = pycoco_direct(*ptb_direct([EXAMPLE[which][i] for i in ids], [EXAMPLE["refs"][i] for i in ids]),
                        names=["bleu4"])["bleu4"][1]
    np.testing.assert_allclose([r["score"] for r in got_rows if r["metric"] == "bleu4"], per, atol=1e-12)
    assert all(len(r["stats"].split()) == 10 for r in got_rows if r["metric"].startswith("bleu"))
    assert all(len(r["stats"].split()) == 23 for r in got_rows if r["metric"] == "meteor")
    assert all(r["stats"] is None for r in got_rows if r["metric"] in ("rouge-l", "cider"))


PACSCORE_EXAMPLE = os.environ.get("CAPSCORE_PACSCORE_EXAMPLE")


@pytest.mark.skipif(not PACSCORE_EXAMPLE, reason="set CAPSCORE_PACSCORE_EXAMPLE to the example/ folder of a "
                                                 "checkout of github.com/aimagelab/pacscore")
@pytest.mark.parametrize("which", ["good_captions", "bad_captions"])
def test_the_pacscore_repositorys_own_example_gives_its_readmes_numbers(which, tmp_path):
    """The command as a user types it in pacscore's example/ folder (its images, captions and references; not
    copied here: the repository carries no licence), in a process of its own: the values pacscore's README
    prints, no model or backbone recorded, no torch imported, at most 20 CPU-seconds (Java included)."""
    import resource

    out = tmp_path / f"{which}.jsonl"
    probe = ("import json, sys\nfrom capscore.cli import main\ncode = main(sys.argv[1:])\n"
             "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules}))\n")
    args = ["score", "--images", "images", "--captions", f"{which}.json", "--refs", "refs.json", "--metric", *FIVE,
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", probe, *args], cwd=PACSCORE_EXAMPLE, capture_output=True,
                          text=True, env=env, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"code": 0, "torch": False}, proc.stderr
    summary = json.loads(Path(f"{out}.summary.json").read_text())
    got = headlines(summary)
    assert [round(got[m], 4) for m in FIVE] == PACSCORE_README[which]
    for m, value in zip(FIVE, PACSCORE_README[which]):
        assert f"{m} (text only): 2 scored, 0 skipped, headline " in proc.stdout and f"{value:.4f}" in proc.stdout
    assert summary["model"] is None and summary["backbone"] is None
    assert all(r["model"] is None and r["backbone"] is None for r in summary["runs"])
    assert {r["model"] for r in rows(out)} == {None}
    assert cpu <= 20, f"{cpu:.1f} CPU-s"


def test_text_only_imports_no_torch(tmp_path):
    """A subprocess runs `capscore score` with text metrics only; torch (and open_clip) never load."""
    caps = write(tmp_path / "c.json", EXAMPLE["good_captions"])
    refs = write(tmp_path / "r.json", EXAMPLE["refs"])
    probe = ("import json, sys\nfrom capscore.cli import main\n"
             f"code = main(['-q', 'score', '--captions', {str(caps)!r}, '--refs', {str(refs)!r}, '--metric', 'bleu4', "
             f"'cider', 'meteor', '--out', {str(tmp_path / 'o.jsonl')!r}])\n"
             "print(json.dumps({'code': code, 'torch': 'torch' in sys.modules, 'open_clip': 'open_clip' in "
             "sys.modules}))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=600)
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"code": 0, "torch": False, "open_clip": False}, proc.stderr


# ------------------------------------------------------------------------------------ headlines vs pycocoevalcap
def test_a_1000_caption_set_through_the_cli_the_api_and_captionscore(tmp_path, session):  # noqa: F811
    import capscore
    from capscore.integrations.torchmetrics import CaptionScore

    cands, refs = coco_like(1100, seed=3)
    ids = [f"im{i}" for i in range(len(cands))]
    caps = write(tmp_path / "sys.json", dict(zip(ids, cands)))
    ref_file = write(tmp_path / "refs.json", dict(zip(ids, refs)))
    out = tmp_path / "o.parquet"
    assert cli("score", "--captions", caps, "--refs", ref_file, "--metric", *ALL, "--out", out) == 0
    want = direct(cands, refs, ALL)
    got = headlines(json.loads((tmp_path / "o.parquet.summary.json").read_text()))
    for m in ALL:
        assert got[m] == pytest.approx(want[m], abs=1e-12), m
    api = capscore.score(None, cands, refs, metric=ALL, aggregate=True)
    for m in ALL:
        assert api[m] == pytest.approx(want[m], abs=1e-12), m
    for m in ("bleu4", "cider"):  # CaptionScore: several updates, one headline over all of them
        metric = CaptionScore(metric=m)
        for lo in range(0, len(cands), 256):
            metric.update(None, cands[lo:lo + 256], refs[lo:lo + 256])
        assert float(metric.compute()) == pytest.approx(want[m], abs=1e-12), m


def _systems(n: int = 120):
    """Three systems over the same images and a fourth over a subset; the references of all."""
    cands, refs = coco_like(n, seed=7)
    other, _ = coco_like(n, seed=8)  # captions of other scenes: a worse system
    ids = [f"{i:03d}" for i in range(n)]
    systems = {"a": dict(zip(ids, cands)), "b": dict(zip(ids, other)),
               "c": {k: " ".join(c.split()[:-2]) or c for k, c in zip(ids, cands)},
               "d": dict(zip(ids[:50], cands[:50]))}
    return systems, dict(zip(ids, refs))


def test_several_systems_each_get_their_own_headline_and_corpus_tests(tmp_path, capsys, session):  # noqa: F811
    systems, refs = _systems()
    files = [write(tmp_path / f"{name}.json", caps) for name, caps in systems.items()]
    ref_file = write(tmp_path / "refs.json", refs)
    out = tmp_path / "o.csv"
    assert cli("score", "--captions", *files, "--refs", ref_file, "--metric", *FIVE, "--out", out) == 0
    summary = json.loads((tmp_path / "o.csv.summary.json").read_text())
    want = {}
    for name, caps in systems.items():
        keys = list(caps)
        want[name] = direct([caps[k] for k in keys], [refs[k] for k in keys], FIVE)
        got = headlines(summary, name)
        for m in FIVE:  # CIDEr's IDF over the system's own set: "d" covers 50 of the 120 images
            assert got[m] == pytest.approx(want[name][m], abs=1e-12), (name, m)
    # the run's own value pools every system's captions, as pycocoevalcap would on one file of all of them
    pooled = [(c, refs[k]) for caps in systems.values() for k, c in caps.items()]
    assert headlines(summary)["bleu4"] == pytest.approx(
        direct([c for c, _ in pooled], [r for _, r in pooled], ["bleu4"])["bleu4"], abs=1e-12)
    # the paired tests between systems test the headline: the observed difference is pycocoevalcap's
    tests = {(t["metric"], t["a"], t["b"]): t for t in summary["system_tests"]}
    boot, ar = tests[("bleu4", "a", "b")]["tests"]
    assert boot["statistic"] == ar["statistic"] == "corpus-bleu4"
    assert boot["delta"] == pytest.approx(want["a"]["bleu4"] - want["b"]["bleu4"], abs=1e-12)
    assert tests[("meteor", "a", "c")]["tests"][0]["delta"] == pytest.approx(
        want["a"]["meteor"] - want["c"]["meteor"], abs=1e-12)
    printed = capsys.readouterr().out
    assert "corpus-bleu4" in printed and "paired tests between systems of each metric's headline" in printed
    # capscore.score on one system gives the same headlines
    import capscore

    keys = list(systems["d"])
    api = capscore.score(None, [systems["d"][k] for k in keys], [refs[k] for k in keys], metric=FIVE, aggregate=True)
    for m in FIVE:
        assert api[m] == pytest.approx(want["d"][m], abs=1e-12)


def test_coco_results_and_coco_annotations_need_no_images(tmp_path, session):  # noqa: F811
    cands, refs = coco_like(40, seed=11)
    results = [{"image_id": 1000 + i, "caption": c} for i, c in enumerate(cands)]
    ann = {"images": [{"id": 1000 + i, "file_name": f"COCO_val2014_{1000 + i:012d}.jpg"} for i in range(40)],
           "annotations": [{"image_id": 1000 + i, "id": 5 * i + k, "caption": r}
                           for i, rs in enumerate(refs) for k, r in enumerate(rs)]}
    out = tmp_path / "o.jsonl"
    assert cli("score", "--captions", write(tmp_path / "captions_val2014_fakecap_results.json", results),
               "--refs", write(tmp_path / "captions_val2014.json", ann), "--metric", "bleu4", "cider", "--out",
               out) == 0
    assert [r["id"] for r in rows(out)][:2] == ["1000", "1001"]
    got = headlines(json.loads((tmp_path / "o.jsonl.summary.json").read_text()))
    want = direct(cands, refs, ["bleu4", "cider"])
    assert got == pytest.approx(want, abs=1e-12)


# ------------------------------------------------------------------------------------ resume, compare, report
def test_resume_rebuilds_the_headline_exactly(tmp_path):
    cands, refs = coco_like(30, seed=5)
    ids = [str(i) for i in range(30)]
    caps, ref_file = write(tmp_path / "c.json", dict(zip(ids, cands))), write(tmp_path / "r.json", dict(zip(ids, refs)))
    for ext, second in (("jsonl", "meteor"), ("csv", "rouge-l")):  # one METEOR start per run is slow: once
        full, part = tmp_path / f"full.{ext}", tmp_path / f"part.{ext}"
        args = ["score", "--captions", caps, "--refs", ref_file, "--metric", "bleu4", second, "--chunk-size", "7"]
        assert cli(*args, "--out", full) == 0
        lines = full.read_text().splitlines(keepends=True)
        part.write_text("".join(lines[:(1 if ext == "csv" else 0) + 41]))  # bleu4 done, the second under way
        summary = json.loads((tmp_path / f"full.{ext}.summary.json").read_text())
        (tmp_path / f"part.{ext}.summary.json").write_text(json.dumps({**summary, "status": "running",
                                                                       "captions": summary["captions"]}))
        assert cli(*args, "--out", part, "--resume") == 0
        resumed = json.loads((tmp_path / f"part.{ext}.summary.json").read_text())
        assert resumed["resumed_rows"] == 41
        assert [r["aggregate"] for r in resumed["runs"]] == [r["aggregate"] for r in summary["runs"]]


def test_compare_tests_the_corpus_headline_recomputed_on_each_resample(tmp_path, capsys):
    """The bootstrap and randomisation of corpus BLEU-4, against the statistic recomputed by pycocoevalcap's own
    BleuScorer on every resample (the same draws: numpy's default_rng(seed), one block)."""
    from pycocoevalcap.bleu.bleu import Bleu

    cands, refs = coco_like(40, seed=21)
    worse, _ = coco_like(40, seed=22)
    ids = [str(i) for i in range(40)]
    ref_file = write(tmp_path / "r.json", dict(zip(ids, refs)))
    paths = []
    for name, caps in (("a", cands), ("b", worse)):
        paths.append(tmp_path / f"{name}.jsonl")
        assert cli("score", "--captions", write(tmp_path / f"{name}.json", dict(zip(ids, caps))), "--refs", ref_file,
                   "--metric", "bleu4", "--tokenizer", "simple", "--out", paths[-1]) == 0
    capsys.readouterr()
    assert cli("compare", *paths, "--resamples", "30", "--seed", "4", "--out", tmp_path / "c.json") == 0
    assert "corpus-bleu4 A" in capsys.readouterr().out
    boot, ar = json.loads((tmp_path / "c.json").read_text())["tests"]
    tok = [classic.simple_tokenize(c) for c in cands], [classic.simple_tokenize(c) for c in worse]
    tok_refs = [[classic.simple_tokenize(r) for r in rs] for rs in refs]

    def bleu4(caps, items) -> float:  # pycocoevalcap's corpus BLEU-4 of a multiset of items
        res = {k: [caps[i]] for k, i in enumerate(items)}
        return Bleu(4).compute_score({k: tok_refs[i] for k, i in enumerate(items)}, res, verbose=0)[0][3]

    everything = list(range(40))
    delta = bleu4(tok[0], everything) - bleu4(tok[1], everything)
    assert boot["statistic"] == "corpus-bleu4" and boot["delta"] == pytest.approx(delta, abs=1e-12)
    draws = np.random.default_rng(4).integers(0, 40, size=(30, 40))
    want = np.array([bleu4(tok[0], d) - bleu4(tok[1], d) for d in draws])
    assert boot["p_value"] == pytest.approx(np.mean(np.abs(want - delta) >= abs(delta)))
    assert boot["ci"] == pytest.approx(list(np.quantile(want, [0.025, 0.975])), abs=1e-12)
    swaps = 1 - np.random.default_rng(4).integers(0, 2, size=(30, 40))  # 1: the two systems' captions swapped
    perm = []
    for s in swaps:
        mine = [tok[1][i] if s[i] else tok[0][i] for i in everything]
        theirs = [tok[0][i] if s[i] else tok[1][i] for i in everything]
        perm.append(bleu4(mine, everything) - bleu4(theirs, everything))
    hits = np.sum(np.abs(perm) >= abs(delta) - 1e-12)
    assert ar["p_value"] == pytest.approx((hits + 1) / 31)


def test_report_shows_the_headline(tmp_path):
    systems, refs = _systems(30)
    files = [write(tmp_path / f"{n}.json", systems[n]) for n in ("a", "b")]
    out = tmp_path / "o.jsonl"
    assert cli("score", "--captions", *files, "--refs", write(tmp_path / "r.json", refs), "--metric", "bleu4",
               "--tokenizer", "simple", "--out", out) == 0
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert cli("report", out, "--out", tmp_path / "r.html") == 0
    html = (tmp_path / "r.html").read_text()
    assert "bleu4 (text only)" in html and "headline corpus-bleu4" in html and "sentence-level BLEU-4" in html
    for system in ("a", "b"):
        assert f"{summary['aggregate']['systems'][system]:.4f}" in html


# ------------------------------------------------------------------------------------ no image, no model
def test_no_refs_is_one_line_naming_refs(tmp_path, capsys):
    caps = write(tmp_path / "c.json", {"a": "a dog"})
    assert cli("score", "--captions", caps, "--metric", "bleu4", "--out", tmp_path / "o.jsonl") == 2
    one_line_error(capsys, "bleu4", "--refs")
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "o.jsonl.summary.json").exists()
    assert cli("score", "--captions", caps, "--metric", "clip-s", "--out", tmp_path / "o.jsonl") == 2
    one_line_error(capsys, "--images")


def test_a_model_given_for_text_metrics_is_not_loaded(tmp_path, capsys):
    caps = write(tmp_path / "c.json", EXAMPLE["good_captions"])
    refs = write(tmp_path / "r.json", EXAMPLE["refs"])
    out = tmp_path / "o.jsonl"  # a model that cannot load: loading it would fail the run
    assert cli("score", "--model", f"ckpt:{tmp_path / 'missing.pth'}", "--captions", caps, "--refs", refs, "--metric",
               "bleu4", "--tokenizer", "simple", "--out", out, quiet=False) == 0
    assert "is not loaded: bleu4 read text only" in capsys.readouterr().err
    assert json.loads((tmp_path / "o.jsonl.summary.json").read_text())["model"] is None


def test_a_mixed_run_loads_the_model_for_the_metrics_that_encode(tmp_path, make_images, capsys):
    paths = make_images(3)
    caps = write(tmp_path / "c.json", {p.stem: f"a picture number {i}" for i, p in enumerate(paths)})
    refs = write(tmp_path / "r.json", {p.stem: [f"a picture {i}", "an image"] for i, p in enumerate(paths)})
    out = tmp_path / "o.jsonl"
    assert cli("score", "--model", "capscore-test-tiny", "--images", paths[0].parent, "--captions", caps, "--refs",
               refs, "--metric", "clip-s", "bleu4", "--tokenizer", "simple", "--out", out) == 0
    got = rows(out)
    assert [(r["model"], r["metric"]) for r in got[::3]] == [(None, "bleu4"), ("capscore-test-tiny", "clip-s")]
    runs = json.loads((tmp_path / "o.jsonl.summary.json").read_text())["runs"]
    assert runs[0]["model"] is None and runs[1]["backbone"].startswith("open_clip:capscore-test-tiny")
    printed = capsys.readouterr().out
    assert "bleu4 (text only)" in printed and "clip-s with capscore-test-tiny" in printed


# ------------------------------------------------------------------------------------ bad input
def test_bad_text_input_is_one_line_or_a_documented_value(tmp_path, capsys, session):  # noqa: F811
    cands, refs = coco_like(12, seed=9)
    ids = [str(i) for i in range(12)]
    cands[3] = ""  # an empty candidate: pycocoevalcap's value (0), inside the corpus score
    cands[4] = "Un café à Zürich, 東京の犬 — naïve façade 🐶"
    cands[5] = " ".join(f"word{k % 97} the dog" for k in range(300))  # a very long caption (900 words)
    ref_file = write(tmp_path / "r.json", dict(zip(ids, refs)))
    caps = write(tmp_path / "c.json", dict(zip(ids, cands)))
    out = tmp_path / "o.jsonl"
    assert cli("score", "--captions", caps, "--refs", ref_file, "--metric", *FIVE, "--out", out) == 0
    got = headlines(json.loads((tmp_path / "o.jsonl.summary.json").read_text()))
    assert got == pytest.approx(direct(cands, refs, FIVE), abs=1e-12)
    assert all(r["score"] == 0 for r in rows(out) if r["id"] == "3")
    # an image without references: one line naming it; with --skip-bad an error row, the others' headline
    write(tmp_path / "r2.json", {k: v for k, v in zip(ids, refs) if k != "7"})
    assert cli("score", "--captions", caps, "--refs", tmp_path / "r2.json", "--metric", "bleu4", "--out",
               tmp_path / "p.jsonl") == 2
    one_line_error(capsys, "id '7'", "bleu4 needs references")
    assert not (tmp_path / "p.jsonl.summary.json").exists()
    assert cli("score", "--captions", caps, "--refs", tmp_path / "r2.json", "--metric", "bleu4", "--skip-bad",
               "--out", tmp_path / "p.jsonl") == 0
    summary = json.loads((tmp_path / "p.jsonl.summary.json").read_text())
    keep = [i for i in range(12) if i != 7]
    assert summary["skipped"] == 1 and summary["aggregate"]["value"] == pytest.approx(
        direct([cands[i] for i in keep], [refs[i] for i in keep], ["bleu4"])["bleu4"], abs=1e-12)
    # references that are not strings: one line naming the file and the id
    write(tmp_path / "r3.json", {**dict(zip(ids, refs)), "2": ["a dog", 3]})
    assert cli("score", "--captions", caps, "--refs", tmp_path / "r3.json", "--metric", "bleu4", "--out",
               tmp_path / "q.jsonl") == 2
    one_line_error(capsys, "r3.json: id '2'", "references must be a string or a list of strings")


def test_java_missing_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    caps = write(tmp_path / "c.json", {"a": "a dog on the grass"})
    refs = write(tmp_path / "r.json", {"a": ["a dog"]})
    monkeypatch.setattr(classic.shutil, "which", lambda name: None)
    monkeypatch.setattr(classic, "_PTB_MEMO", {})
    out = tmp_path / "o.jsonl"
    for metric, tokenizer in (("bleu4", "ptb"), ("meteor", "simple")):
        assert cli("score", "--captions", caps, "--refs", refs, "--metric", "cider", metric, "--tokenizer", tokenizer,
                   "--out", out) == 2
        one_line_error(capsys, "needs Java, which was not found on PATH")
        assert not out.exists() and not (tmp_path / "o.jsonl.summary.json").exists()


def test_a_java_failure_mid_run_leaves_no_complete_summary_and_resumes(fake_java, tmp_path, capsys):  # noqa: F811
    caps = write(tmp_path / "c.json", {"a": "a dog", "b": "a cat", "c": "a cow"})
    refs = write(tmp_path / "r.json", {"a": ["a dog"], "b": ["a cat"], "c": ["a cow"]})
    out = tmp_path / "o.jsonl"
    args = ["score", "--captions", caps, "--refs", refs, "--metric", "bleu4", "meteor", "--tokenizer", "simple"]
    fake_java("die-after-1")
    assert cli(*args, "--out", out) == 2
    one_line_error(capsys, "METEOR (java) stopped", "OutOfMemoryError")
    summary = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert summary["status"] == "running" and [r["metric"] for r in rows(out)] == ["bleu4"] * 3
    fake_java("")
    assert cli(*args, "--out", out, "--resume") == 0
    done = json.loads((tmp_path / "o.jsonl.summary.json").read_text())
    assert done["status"] == "complete" and done["resumed_rows"] == 3
    assert cli(*args, "--out", tmp_path / "fresh.jsonl") == 0
    fresh = json.loads((tmp_path / "fresh.jsonl.summary.json").read_text())
    assert [r["aggregate"] for r in done["runs"]] == [r["aggregate"] for r in fresh["runs"]]


# ------------------------------------------------------------------------------------ sessions, correlate
def test_one_meteor_process_and_one_ptb_pass_per_run_and_per_correlate(tmp_path, monkeypatch, capsys):
    from capscore.scores import classic_java

    starts, passes = [], []
    original, ptb = classic_java.Meteor.__init__, classic_java.ptb_tokenize

    def counted(self, *a, **k):
        starts.append(1)
        original(self, *a, **k)

    def tokenized(texts, **k):
        passes.append(len(texts))
        return ptb(texts, **k)

    monkeypatch.setattr(classic_java.Meteor, "__init__", counted)
    monkeypatch.setattr(classic_java, "ptb_tokenize", tokenized)
    monkeypatch.setattr(classic, "_PTB_MEMO", {})  # texts other tests tokenised must reach the jar again
    systems, refs = _systems(20)
    files = [write(tmp_path / f"{n}.json", systems[n]) for n in ("a", "b", "c")]
    assert cli("score", "--captions", *files, "--refs", write(tmp_path / "r.json", refs), "--metric", "meteor",
               "bleu4", "--chunk-size", "4", "--out", tmp_path / "o.jsonl") == 0
    assert len(starts) == 1
    texts = {c for n in ("a", "b", "c") for c in systems[n].values()} | {r for rs in refs.values() for r in rs}
    assert passes == [len(texts)]  # three systems, 15 chunks of 4, two metrics: one PTB pass over every text
    starts.clear()
    passes.clear()
    classic._PTB_MEMO.clear()
    out = tmp_path / "corr"
    assert cli("correlate", "--dataset", "scenes-oracle", "--scenes", "6", "--metric", "meteor", "bleu4", "rouge-l",
               "--classic-backend", "pycocoevalcap", "--bootstrap", "0", "--out", out) == 0
    assert len(starts) == 1
    assert len(passes) == 1  # every caption and reference of the dataset, once
    printed = capsys.readouterr().out
    assert "per-caption values (segment-level METEOR, sentence-level BLEU-4, ROUGE-L) correlated caption by " \
           "caption" in printed
    res = json.loads((out / "correlate.json").read_text())["results"]
    assert {r["params"]["classic_backend"] for r in res} == {"pycocoevalcap"}


def test_captionscore_states_merge_as_ddp_gathers_them(session):  # noqa: F811
    """Two processes' states (as torchmetrics gathers "cat" list states) give the headline of all items."""
    from capscore.integrations.torchmetrics import CaptionScore

    cands, refs = coco_like(60, seed=13)
    want = direct(cands, refs, ["bleu4", "cider"])
    for m in ("bleu4", "cider"):
        one, two = CaptionScore(metric=m), CaptionScore(metric=m)
        one.update(None, cands[:25], refs[:25])
        two.update(None, cands[25:40], refs[25:40])
        two.update(None, cands[40:], refs[40:])
        one.merge_state(two)
        assert float(one.compute()) == pytest.approx(want[m], abs=1e-12)
    with pytest.raises(Exception, match="refs"):
        CaptionScore(metric="bleu4").update(None, ["a dog"])
