"""Polos, DENEB and the judges as registered metrics, through every face: ``capscore score`` / ``correlate`` /
``compare`` / ``report`` / ``doctor``, ``capscore.score``, ``CaptionScore``, and plug-in metrics of the
``capscore.metrics`` entry-point group (a package written to a temporary folder).

The checkpoints are random tensors in the authors' released layouts (tests/learned_weights.py); each face's
numbers are compared with the metric's own function (``score_polos``, ``score_deneb``, ``judge``), whose
forwards tests/test_learned_metrics.py and tests/test_judge.py check against the authors' code."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import learned_weights as lw

CAPS = {"im0": "a dog runs on the grass", "im1": "two cats sleep on a red sofa", "im2": "a man rides a bike"}
REFS = {"im0": ["a dog on grass", "the dog runs"], "im1": ["cats sleep"],
        "im2": ["a man rides a bike in the street", "a bike"]}


@pytest.fixture(scope="module")
def wdir(tmp_path_factory):
    root = lw.weights_dir(tmp_path_factory.mktemp("metric-weights"), polos=True, deneb=True)
    lw.llava_folder(root / "llava-1.5-13b-hf")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("learned-data")
    (d / "img").mkdir()
    for i in range(3):
        Image.fromarray((np.random.RandomState(i).rand(40, 50, 3) * 255).astype("uint8")).save(d / "img" / f"im{i}.png")
    (d / "caps.json").write_text(json.dumps(CAPS))
    (d / "refs.json").write_text(json.dumps(REFS))
    return d


@pytest.fixture()
def short_judge(monkeypatch):
    from capscore.scores import learned

    monkeypatch.setattr(learned, "JUDGE_MAX_NEW_TOKENS", 8)  # a random LLaVA never stops on its own


def _inputs(data):
    ids = sorted(CAPS)
    return [str(data / "img" / f"{i}.png") for i in ids], [CAPS[i] for i in ids], [REFS[i] for i in ids]


def _rows(path: Path, metric: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["metric"] == metric]


def test_cli_scores_polos_deneb_and_fleur_from_the_released_layouts(wdir, data, tmp_path, capsys, short_judge):
    from capscore.backbones.vlm import load_vlm
    from capscore.cli import main
    from capscore.scores.deneb import load_deneb, score_deneb
    from capscore.scores.judge import judge
    from capscore.scores.polos import load_polos, score_polos

    out = tmp_path / "rows.jsonl"
    assert main(["score", "--metric", "polos", "deneb", "fleur", "--metric-weights", str(wdir), "--images",
                 str(data / "img"), "--captions", str(data / "caps.json"), "--refs", str(data / "refs.json"),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(own models) polos" in printed and "(own models) deneb" in printed
    images, caps, refs = _inputs(data)
    polos = score_polos(load_polos(wdir), images, caps, refs)
    deneb = score_deneb(load_deneb(wdir, clip_arch=None), images, caps, refs)
    for metric, want in (("polos", polos), ("deneb", deneb)):
        rows = _rows(out, metric)
        assert [r["id"] for r in rows] == ["im0", "im1", "im2"] and all(r["model"] is None for r in rows)
        assert [r["score"] for r in rows] == pytest.approx(want, abs=1e-6)
    verdicts = judge(load_vlm(wdir / "llava-1.5-13b-hf"), "fleur", images, caps, max_new_tokens=8)
    for r, v in zip(_rows(out, "fleur"), verdicts):
        assert r["answer"] == v.answer  # the judge's answer is kept in the row, read or not
        if math.isnan(v.score):
            assert r["score"] is None and r["error"] == f"fleur: {v.error}"
        else:
            assert r["score"] == pytest.approx(v.score)
    summary = json.loads(out.with_name(out.name + ".summary.json").read_text())
    assert summary["metric_weights"] == str(wdir.resolve()) and summary["model"] is None


def test_absent_weights_are_one_line_naming_the_file_and_where_it_is_published(data, tmp_path, capsys):
    from capscore.cli import main

    rc = main(["score", "--metric", "polos", "--metric-weights", str(tmp_path / "none"), "--images",
               str(data / "img"), "--captions", str(data / "caps.json"), "--refs", str(data / "refs.json"),
               "--out", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0] == (f"capscore: error: polos: {tmp_path / 'none' / 'polos' / 'reprod.ckpt'} not found (the Polos "
                      "checkpoint; published at https://polos-polaris.s3.ap-northeast-1.amazonaws.com/reprod.zip "
                      "(unzip; put reprod/reprod.ckpt and reprod/hparams.yaml in polos/))")


def test_metric_weights_without_such_a_metric_is_refused(data, tmp_path, capsys):
    from capscore.cli import main

    assert main(["score", "--metric", "clip-s", "--model", "scenes-tiny", "--metric-weights", str(tmp_path),
                 "--images", str(data / "img"), "--captions", str(data / "caps.json"),
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "--metric-weights and --explain apply to the metrics with their own models" in capsys.readouterr().err


def test_correlate_puts_clip_s_and_polos_in_one_table(wdir, capsys):
    from capscore.cli import main

    assert main(["correlate", "--dataset", "scenes-oracle", "--metric", "clip-s", "polos", "--model", "scenes-tiny",
                 "--metric-weights", str(wdir), "--scenes", "6", "--bootstrap", "0"]) == 0
    table = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(table) if line.startswith("metric"))
    rows = {line.split()[0]: line for line in table[head + 1: head + 3]}
    assert sorted(rows) == ["clip-s", "polos"]
    assert rows["polos"].split()[1:3] == ["(own", "models)"] and rows["clip-s"].split()[1] == "scenes-tiny"


def test_doctor_lists_the_metric_weights(wdir, tmp_path, capsys):
    from capscore.cli import main

    assert main(["doctor", "--data-root", str(tmp_path), "--weights-root", str(tmp_path),
                 "--metric-weights", str(wdir)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("metric weights")]
    status = {line.split(":")[0].removeprefix("metric weights ").strip(): line for line in lines}
    assert "present" in status["polos"] and str(wdir / "polos" / "reprod.ckpt") in status["polos"]
    assert "present" in status["deneb"] and "present" in status["fleur, reffleur"]
    assert "MISSING" in status["expert"] and "published at" in status["expert"]


@pytest.mark.filterwarnings("ignore:metric clip-s ignores the references")
def test_api_and_caption_score_give_the_cli_numbers(wdir, data):
    import capscore
    from capscore.integrations.torchmetrics import CaptionScore
    from capscore.scores.polos import load_polos, score_polos

    images, caps, refs = _inputs(data)
    want = score_polos(load_polos(wdir), images, caps, refs)
    assert capscore.score(images, caps, refs, metric="polos", metric_weights=str(wdir)) == pytest.approx(want, abs=1e-6)
    frame = capscore.score(images, caps, refs, metric=["polos", "clip-s"], model="scenes-tiny", as_frame=True,
                           metric_weights=str(wdir))
    assert list(frame[frame.metric == "polos"].score) == pytest.approx(want, abs=1e-6)
    assert frame[frame.metric == "polos"].model.isna().all() and (frame[frame.metric == "clip-s"].model == "scenes-tiny").all()
    m = CaptionScore(metric="polos", metric_weights=str(wdir))
    m.update(images[:2], caps[:2], refs[:2])
    m.update(images[2:], caps[2:], refs[2:])
    assert float(m.compute()) == pytest.approx(sum(want) / 3, abs=1e-6)


def test_compare_and_report_read_a_polos_run(wdir, data, tmp_path, capsys):
    from capscore.cli import main

    other = tmp_path / "other.json"
    other.write_text(json.dumps({k: v.split()[-1] + " " + v for k, v in CAPS.items()}))
    outs = []
    for name, caps in (("a", data / "caps.json"), ("b", other)):
        outs.append(tmp_path / f"{name}.jsonl")
        assert main(["score", "--metric", "polos", "--metric-weights", str(wdir), "--images", str(data / "img"),
                     "--captions", str(caps), "--refs", str(data / "refs.json"), "--out", str(outs[-1])]) == 0
    capsys.readouterr()
    assert main(["compare", str(outs[0]), str(outs[1]), "--resamples", "200"]) == 0
    assert "3" in capsys.readouterr().out
    assert main(["report", str(outs[0]), "--out", str(tmp_path / "r.html")]) == 0
    assert "polos (own models)" in (tmp_path / "r.html").read_text()


def test_the_ray_driver_checks_their_files_without_loading_them_and_starts_no_cluster_when_one_is_absent(
        tmp_path, capsys, monkeypatch):
    """--engine ray: the driver checks that each metric's released files are there (its actors load them);
    with DENEB's absent, the run is the local engine's one line before a cluster starts, and the driver has
    loaded no model (Polos's files, present, included)."""
    pytest.importorskip("ray")
    from shard_inputs import samples, write_webdataset

    from capscore.cli import main
    from capscore.engines import ray as ray_engine
    from capscore.scores import learned

    root = lw.weights_dir(tmp_path / "w", polos=True, deneb=False)
    write_webdataset(tmp_path / "shards", samples(1, 2))
    argv = ["-q", "score", "--webdataset", str(tmp_path / "shards"), "--refs-column", "refs", "--metric", "polos",
            "deneb", "--metric-weights", str(root), "--no-cache"]

    def refused(*a, **k):
        raise AssertionError("the driver loaded a model or started a cluster")

    monkeypatch.setattr(learned, "_LOADED", {})
    monkeypatch.setattr(learned, "_load", refused)
    monkeypatch.setattr(ray_engine, "_init", refused)
    assert main(argv + ["--engine", "ray", "--out", str(tmp_path / "ray")]) == 2
    ray_line = capsys.readouterr().err.strip().splitlines()
    monkeypatch.undo()
    assert main(argv + ["--out", f"{tmp_path / 'local'}/"]) == 2
    local_line = capsys.readouterr().err.strip().splitlines()
    assert len(ray_line) == 1 and ray_line == local_line
    assert ray_line[0].startswith(f"capscore: error: deneb: {root.resolve() / 'deneb'}") and "not found" in ray_line[0]
    assert not (tmp_path / "ray").exists()


PLUGIN = '''
from capscore.scores.metric import Metric, Values


class HalfCosine:
    needs = frozenset({"global"})
    columns = ()

    def compute(self, batch):
        return Values(((batch.images() * batch.texts()).sum(-1) / 2).tolist())


METRIC = Metric("half-cos", "a test plug-in", image=HalfCosine(), prefix="", range=(-0.5, 0.5))
'''


def _dist(site: Path, name: str, entry: str) -> None:
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[capscore.metrics]\n{entry}\n")


def test_a_plugin_metric_scores_through_the_cli_and_the_api(data, tmp_path):
    """A package installed into a folder on sys.path (its dist-info naming a ``capscore.metrics`` entry point)
    adds ``half-cos`` = cos/2; a second package whose module is missing is one warning line."""
    site = tmp_path / "site"
    (site / "capscore_halfcos").mkdir(parents=True)
    (site / "capscore_halfcos" / "__init__.py").write_text(PLUGIN)
    _dist(site, "capscore_halfcos", "half-cos = capscore_halfcos:METRIC")
    _dist(site, "broken_plug", "broken = no_such_module_xyz:METRIC")
    out = tmp_path / "p.jsonl"
    script = textwrap.dedent(f"""
        import json, sys
        from capscore.cli import main
        rc = main(["score", "--metric", "half-cos", "cosine", "--model", "scenes-tiny", "--images", {str(data / "img")!r},
                   "--captions", {str(data / "caps.json")!r}, "--out", {str(out)!r}, "-q"])
        import capscore
        api = capscore.score({_inputs(data)[0]!r}, {_inputs(data)[1]!r}, metric="half-cos", model="scenes-tiny")
        main(["models", "--metrics"])
        print(json.dumps({{"rc": rc, "api": api}}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", ""),
                                                         str(Path(__file__).parent.parent / "src")])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    half, cos = _rows(out, "half-cos"), _rows(out, "cosine")
    assert result["rc"] == 0 and len(half) == 3
    assert [r["score"] for r in half] == pytest.approx([r["score"] / 2 for r in cos], abs=1e-6)
    assert result["api"] == pytest.approx([r["score"] for r in half], abs=1e-6)
    assert any(line.split()[:1] == ["half-cos"] for line in proc.stdout.splitlines())
    warned = [line for line in proc.stderr.splitlines() if "broken" in line]
    assert warned and all(line == warned[0] for line in warned)  # the same single line wherever it is shown
    assert warned[0] == ("capscore: warning: metric plug-in 'broken' (no_such_module_xyz:METRIC, package broken_plug) "
                         "was not loaded: ModuleNotFoundError: No module named 'no_such_module_xyz'")


def test_each_checkpoint_is_loaded_once_per_run(wdir, data, tmp_path, monkeypatch):
    """Two systems, chunks of one item, and correlate's metrics: one load of each metric's files."""
    from capscore.cli import main
    from capscore.scores import learned

    loads = []
    real = learned._load
    monkeypatch.setattr(learned, "_LOADED", {})
    monkeypatch.setattr(learned, "_load", lambda kind, *a: loads.append(kind) or real(kind, *a))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({k: "a photo" for k in CAPS}))
    assert main(["-q", "score", "--metric", "polos", "deneb", "--metric-weights", str(wdir), "--images",
                 str(data / "img"), "--captions", str(data / "caps.json"), str(other), "--refs",
                 str(data / "refs.json"), "--chunk-size", "1", "--out", str(tmp_path / "o.jsonl")]) == 0
    assert len(_rows(tmp_path / "o.jsonl", "polos")) == 6 and sorted(loads) == ["deneb", "polos"]


def test_polos_and_clip_s_on_one_tower_encode_each_image_once(wdir, data, tmp_path, monkeypatch):
    """--model naming a file with Polos's own CLIP tensors: one forward per distinct image for Polos, CLIP-S
    and cosine (the random tower's CLIP-S is clamped to 0 here; cosine is its unclamped cosine), each metric
    with the numbers it has run alone; with another --model each tower encodes the images."""
    import torch

    from capscore.backbones.released import read_checkpoint
    from capscore.cli import main
    from capscore.embed.engine import Encoder

    sd, _ = read_checkpoint(wdir / "polos" / "reprod.ckpt")
    tower = tmp_path / "polos-clip.pt"
    torch.save({k[len("clip."):]: v for k, v in sd.items() if k.startswith("clip.")}, tower)
    seen = {"images": 0}
    real = Encoder._forward_pixels
    monkeypatch.setattr(Encoder, "_forward_pixels",
                        lambda self, c, px, **k: seen.update(images=seen["images"] + len(px)) or real(self, c, px, **k))

    def run(out, *metrics, model=f"capscore-test-tiny/{tower}"):
        seen["images"] = 0
        weights = ["--metric-weights", str(wdir)] if "polos" in metrics else []
        assert main(["-q", "score", "--metric", *metrics, "--model", model, *weights,
                     "--images", str(data / "img"), "--captions", str(data / "caps.json"), "--refs",
                     str(data / "refs.json"), "--no-cache", "--out", str(tmp_path / out)]) == 0
        return seen["images"]

    assert run("both.jsonl", "polos", "clip-s", "cosine") == 3
    assert run("alone.jsonl", "polos") == 3 and run("clip.jsonl", "clip-s", "cosine") == 3
    for metric, alone in (("polos", "alone.jsonl"), ("clip-s", "clip.jsonl"), ("cosine", "clip.jsonl")):
        got, want = _rows(tmp_path / "both.jsonl", metric), _rows(tmp_path / alone, metric)
        assert [r["id"] for r in got] == [r["id"] for r in want]
        assert [r["score"] for r in got] == pytest.approx([r["score"] for r in want], abs=1e-6)
    assert run("apart.jsonl", "polos", "clip-s", model="scenes-tiny") == 6
    assert [r["score"] for r in _rows(tmp_path / "apart.jsonl", "polos")] == \
        pytest.approx([r["score"] for r in _rows(tmp_path / "alone.jsonl", "polos")], abs=1e-6)


def test_a_warm_rerun_encodes_nothing_and_polos_and_deneb_share_the_simcse_features(wdir, data, tmp_path,
                                                                                  monkeypatch):
    """With the persistent cache: the first run encodes each distinct text once with SimCSE for both metrics
    (their checkpoints carry the same SimCSE weights) and each image once per CLIP tower (DENEB's normalises
    pixels otherwise than Polos's); the rerun encodes nothing and gives the same rows."""
    from capscore.backbones.sentence import SentenceEncoder
    from capscore.cli import main
    from capscore.embed.engine import Encoder

    seen = {"texts": 0, "images": 0}
    forward, pixels = SentenceEncoder._forward, Encoder._forward_pixels
    monkeypatch.setattr(SentenceEncoder, "_forward",
                        lambda self, rows: seen.update(texts=seen["texts"] + len(rows)) or forward(self, rows))
    monkeypatch.setattr(Encoder, "_forward_pixels",
                        lambda self, c, px, **k: seen.update(images=seen["images"] + len(px)) or pixels(self, c, px, **k))

    def run(out):
        seen.update(texts=0, images=0)
        assert main(["-q", "score", "--metric", "polos", "deneb", "--metric-weights", str(wdir), "--images",
                     str(data / "img"), "--captions", str(data / "caps.json"), "--refs", str(data / "refs.json"),
                     "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / out)]) == 0
        return dict(seen)

    distinct = len(set(CAPS.values()) | {r for refs in REFS.values() for r in refs})
    assert run("first.jsonl") == {"texts": distinct, "images": 6}
    assert run("again.jsonl") == {"texts": 0, "images": 0}
    for metric in ("polos", "deneb"):
        first, again = _rows(tmp_path / "first.jsonl", metric), _rows(tmp_path / "again.jsonl", metric)
        assert [r["score"] for r in again] == [r["score"] for r in first] and len(first) == 3


def test_the_api_keeps_polos_tower_vectors_where_its_cache_parameter_says(wdir, data, tmp_path, monkeypatch):
    """capscore.score(cache=None) writes no cache file (the towers' vectors stay in memory); cache=FOLDER keeps
    them, the SimCSE features too, in FOLDER's database."""
    import capscore
    from capscore.embed.cache import EmbeddingCache

    opened = []
    real = EmbeddingCache.__init__
    monkeypatch.setattr(EmbeddingCache, "__init__", lambda self, path=None, **k: opened.append(path) or
                        real(self, path, **k))
    images, caps, refs = _inputs(data)
    first = capscore.score(images, caps, refs, metric="polos", metric_weights=str(wdir))
    assert opened == []
    again = capscore.score(images, caps, refs, metric="polos", metric_weights=str(wdir), cache=str(tmp_path / "c"))
    assert again == pytest.approx(first, abs=1e-6) and len(opened) == 1
    db = EmbeddingCache(tmp_path / "c")
    assert len(db) >= 2 * 3 and db.feature_bytes() > 0  # raw + normalised image vectors; SimCSE features
