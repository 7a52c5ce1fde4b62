"""The metric registry through every face: one parametrised test over every registered metric.

For each metric and each medium it scores, the rows of ``capscore score`` (CLI), of the pipeline
called directly, of ``capscore.score`` and of ``CaptionScore`` are the same numbers; several models
and several metrics run in one call. Adding a metric to the registry adds its cases here.
The Ray engine's equality is checked in tests/test_ray_engine.py (slow tier).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from capscore.cli import main
from capscore.data.records import Record
from capscore.data.sources import InMemory
from capscore.pipeline import ScoreJob, columns_for, iter_rows
from capscore.scores.metric import get_metric, metric_names

MODEL = "capscore-test-tiny"


def metric_case(name: str, *values):
    """A test case of the metric ``name``. METEOR and SPICE start a Java process per call (10-20 s each on a
    2-core CPU), so their cases run in the slow tier; tests/test_classic_metrics.py checks their numbers in the
    fast one, and every other metric takes the same faces here."""
    try:
        from capscore.scores.classic import NEEDS_JAVA
    except ImportError:
        NEEDS_JAVA = frozenset()
    return pytest.param(name, *values, marks=[pytest.mark.slow] if name in NEEDS_JAVA else [])


#: The judges (fleur, reffleur, expert): a random-weight LLaVA writes no readable score, so every row is an
#: error row; tests/test_learned_faces.py checks their rows through the CLI against ``judge`` instead.
JUDGES = ("fleur", "reffleur", "expert")
CASES = [metric_case(name, medium) for name in metric_names() if name not in JUDGES
         for medium in get_metric(name).media]


@pytest.fixture(scope="module")
def metric_weights(tmp_path_factory):
    """Polos and DENEB checkpoints in the released layouts (random tensors), for the metrics with own models."""
    from learned_weights import weights_dir

    return weights_dir(tmp_path_factory.mktemp("metric-weights"), polos=True, deneb=True)


@pytest.fixture
def own_models(request, metric_weights, monkeypatch):
    """$CAPSCORE_METRIC_WEIGHTS for every face of the case (the documented default folder)."""
    monkeypatch.setenv("CAPSCORE_METRIC_WEIGHTS", str(metric_weights))


@pytest.fixture
def inputs(tmp_path):
    """Three images, three 3-frame videos (frame folders), captions with references."""
    rng = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    (tmp_path / "videos").mkdir()
    for i in range(3):
        Image.fromarray((rng.random((40, 40, 3)) * 255).astype("uint8")).save(tmp_path / "images" / f"v{i}.png")
        d = tmp_path / "videos" / f"v{i}"
        d.mkdir()
        for f in range(3):
            Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(d / f"{f:03d}.png")
    caps = [{"image": f"v{i}", "caption": c, "id": f"c{i}", "refs": [f"a red cube number {i}", "a blue ball"]}
            for i, c in enumerate(["a red cube on the left", "a small blue ball", "two green cubes"])]
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps(c) + "\n" for c in caps))
    return tmp_path, caps


def _cli_rows(tmp_path, medium, metrics, models=(MODEL,)):
    out = tmp_path / f"rows-{medium}-{'-'.join(metrics)}-{'-'.join(models)}.jsonl"
    flag = "--videos" if medium == "video" else "--images"
    argv = ["-q", "score", "--model", *models, "--metric", *metrics, flag, tmp_path / f"{medium}s",
            "--captions", tmp_path / "caps.jsonl", "--out", out, "--cache-dir", tmp_path / "cache"]
    if medium == "video":
        argv += ["--frames", "all"]
    assert main([str(a) for a in argv]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def _records(tmp_path, caps, medium):
    from capscore.data.captions import index_images, read_captions

    if medium == "video":
        from capscore.data.video import index_videos

        index = index_videos(tmp_path / "videos")
    else:
        index = index_images(tmp_path / "images")
    return [r for r in read_captions(tmp_path / "caps.jsonl", images=index) if isinstance(r, Record)]


@pytest.mark.parametrize("name,medium", CASES)
def test_every_metric_gives_the_same_rows_in_every_face(name, medium, inputs, tiny_backbone, own_models):
    from capscore.meta.reproduce import missing_tools

    if missing_tools(name):  # the classic metrics: pycocoevalcap, Java, CoreNLP (SPICE)
        pytest.skip(missing_tools(name))
    tmp_path, caps = inputs
    cli = _cli_rows(tmp_path, medium, [name])
    assert [r["id"] for r in cli] == ["c0", "c1", "c2"] and all(r["error"] is None for r in cli)
    text_only = get_metric(name).text_only(medium)  # the classic metrics: no model is loaded or recorded
    no_model = get_metric(name).backbone_free(medium)  # ... nor for those with their own models (polos, deneb)
    assert {r["metric"] for r in cli} == {name} and {r["model"] for r in cli} == {None if no_model else MODEL}
    lo, hi = get_metric(name).range  # the declared range (of the image formula)
    assert medium == "video" or all(lo - 1e-6 <= r["score"] <= hi + 1e-6 for r in cli)
    # the pipeline called directly on the same records (its own encoder): the same rows
    options = {"sampling": "all"} if medium == "video" else {}
    job = ScoreJob(source=InMemory(tuple(_records(tmp_path, caps, medium)), medium=medium), models=(MODEL,),
                   metrics=(name,), options=options, progress=False)
    direct = list(iter_rows(job))
    cols = columns_for(medium, [get_metric(name)])
    for a, b in zip(cli, direct, strict=True):
        for c in cols:
            if c in ("image", "video"):
                continue
            if isinstance(a[c], float):
                assert b[c] == pytest.approx(a[c], abs=1e-6), c
            else:
                assert a[c] == b[c], c
    if medium != "image":
        return
    import capscore

    paths = [tmp_path / "images" / f"{c['image']}.png" for c in caps]
    refs = [c["refs"] for c in caps]
    api = capscore.score(paths, [c["caption"] for c in caps], refs, model=tiny_backbone, metric=name)
    np.testing.assert_allclose(api, [r["score"] for r in cli], atol=1e-6)
    tm = pytest.importorskip("capscore.integrations.torchmetrics")
    summary = json.loads((tmp_path / f"rows-image-{name}-{MODEL}.jsonl.summary.json").read_text())
    headline = (summary.get("aggregate") or {"value": summary["mean"]})["value"]  # what the CLI printed
    if text_only:  # a classic metric's compute() is its headline over every update (corpus BLEU, ...)
        metric = tm.CaptionScore(tiny_backbone, name)
        metric.update(paths[:2], [c["caption"] for c in caps[:2]], refs[:2])
        metric.update(None, [c["caption"] for c in caps[2:]], refs[2:])
        assert float(metric.compute()) == pytest.approx(headline, abs=1e-12)
        assert capscore.score(None, [c["caption"] for c in caps], refs, metric=name, aggregate=True) == \
            pytest.approx(headline, abs=1e-12)
        return
    if "corpus" in get_metric(name).needs(medium):  # a corpus metric that encodes: no running mean over updates
        from capscore.errors import CapscoreError

        with pytest.raises(CapscoreError, match="running mean"):
            tm.CaptionScore(tiny_backbone, name)
        return
    metric = tm.CaptionScore(tiny_backbone, name)
    metric.update(paths[:2], [c["caption"] for c in caps[:2]], refs[:2])
    metric.update(paths[2:], [c["caption"] for c in caps[2:]], refs[2:])
    assert float(metric.compute()) == pytest.approx(np.mean([r["score"] for r in cli]), abs=1e-5)
    assert headline == pytest.approx(np.mean([r["score"] for r in cli]), abs=1e-12)


def test_several_models_and_metrics_in_one_call(inputs, tmp_path):
    """Two models × two metrics: rows per (model, metric) in input order, each equal to its own run."""
    many = _cli_rows(tmp_path, "image", ["clip-s", "refclip-s"], models=(MODEL, "scenes-tiny"))
    assert [(r["model"], r["metric"]) for r in many[::3]] == [
        (MODEL, "clip-s"), (MODEL, "refclip-s"), ("scenes-tiny", "clip-s"), ("scenes-tiny", "refclip-s")]
    for model in (MODEL, "scenes-tiny"):
        for metric in ("clip-s", "refclip-s"):
            alone = _cli_rows(tmp_path, "image", [metric], models=(model,))
            part = [r for r in many if r["model"] == model and r["metric"] == metric]
            np.testing.assert_allclose([r["score"] for r in part], [r["score"] for r in alone], atol=1e-6)
    videos = _cli_rows(tmp_path, "video", ["clip-s", "emscore"])
    assert [r["metric"] for r in videos] == ["clip-s"] * 3 + ["emscore"] * 3


def test_a_metric_of_the_other_medium_is_one_line(inputs, capsys):
    tmp_path, _ = inputs
    argv = ["score", "--model", MODEL, "--metric", "emscore", "--images", tmp_path / "images", "--captions",
            tmp_path / "caps.jsonl", "--out", tmp_path / "o.jsonl"]
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--metric 'emscore' scores videos, not images; use it with --videos" in err[0]


def test_registry_rows_declare_what_a_face_needs():
    for name in metric_names():
        m = get_metric(name)
        assert m.media and m.citation and m.range[0] < m.range[1]
        for medium in m.media:
            assert m.needs(medium) <= {"global", "tokens", "patches", "frames", "refs", "parse", "corpus", "weights"}
            assert ("refs" in m.needs(medium)) == m.needs_refs
    from capscore.errors import CapscoreError

    with pytest.raises(CapscoreError, match="did you mean 'clip-s'"):
        get_metric("clip_s")
