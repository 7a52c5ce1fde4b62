"""Classic metrics: equal to pycocoevalcap called directly, and to small examples computed by hand."""
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("pycocoevalcap")

from capscore.errors import CapscoreError  # noqa: E402
from capscore.scores import classic  # noqa: E402

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no Java (PTB tokenizer, METEOR)")

CANDS = ["A man is riding a brown horse on the beach.", "Two dogs play with a red ball in the grass!",
         "a woman holding an umbrella in the rain", "The cat's sitting on a wooden table.",
         "children are playing soccer in a park"]
REFS = [["a man rides a horse along the beach", "a person riding a horse near the ocean", "a rider on a brown horse"],
        ["two dogs playing with a ball", "a pair of dogs chase a red ball on grass"],
        ["a woman with an umbrella walks in the rain", "someone holds an umbrella while it rains"],
        ["a cat sits on a table", "a grey cat on a wooden table"],
        ["kids playing football on a field", "a group of children play soccer in the park"]]


def _direct_tokenised():
    """The COCO evaluation's own path: PTBTokenizer on the gts/res dicts, keyed by image."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in rs] for i, rs in enumerate(REFS)})
    res = tok.tokenize({i: [{"caption": c}] for i, c in enumerate(CANDS)})
    return gts, res


@needs_java
def test_every_metric_equals_pycocoevalcap_called_directly():
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge

    gts, res = _direct_tokenised()
    got = classic.classic_scores(["bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge-l", "cider"], CANDS, REFS)
    corpus, per = Bleu(4).compute_score(gts, res, verbose=0)
    for k in range(4):
        np.testing.assert_allclose(got[f"bleu{k + 1}"].values, per[k], rtol=0, atol=0)
        assert got[f"bleu{k + 1}"].corpus == corpus[k]
    mean, per = Rouge().compute_score(gts, res)
    np.testing.assert_allclose(got["rouge-l"].values, per, rtol=0, atol=0)
    mean, per = Cider().compute_score(gts, res)
    np.testing.assert_allclose(got["cider"].values, per, rtol=0, atol=0)
    assert got["cider"].warnings and "5 reference set" in got["cider"].warnings[0]
    meteor = Meteor()
    mean, per = meteor.compute_score(gts, res)
    np.testing.assert_allclose(got["meteor"].values, per, rtol=0, atol=0)
    assert got["meteor"].corpus == pytest.approx(mean)


def test_bleu_by_hand():
    # "the cat sat on the mat" vs "the cat is on the mat": clipped unigram matches 5/6, bigrams
    # (the cat, on the, the mat) 3/5, trigrams (on the mat) 1/4, 4-grams 0/3; same length, no penalty.
    # pycocoevalcap's sentence BLEU adds tiny = 1e-15 to each numerator and small = 1e-9 to each denominator.
    got = classic.classic_scores(["bleu1", "bleu2", "bleu3", "bleu4"], ["the cat sat on the mat", "the cat"],
                                 [["the cat is on the mat"], ["the cat is on the mat"]], tokenizer="none")
    tiny, small = 1e-15, 1e-9
    p = [(5 + tiny) / (6 + small), (3 + tiny) / (5 + small), (1 + tiny) / (4 + small), tiny / (3 + small)]
    assert got["bleu1"].values[0] == pytest.approx(5 / 6, rel=1e-8)
    assert got["bleu2"].values[0] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), rel=1e-8)
    assert got["bleu3"].values[0] == pytest.approx(0.5, rel=1e-8)  # (5/6 · 3/5 · 1/4)^(1/3) = 0.125^(1/3)
    assert got["bleu4"].values[0] == pytest.approx(np.prod(p) ** 0.25, rel=1e-6)
    # "the cat": both unigrams match, but the brevity penalty is exp(1 - 6/2) = exp(-2)
    assert got["bleu1"].values[1] == pytest.approx(math.exp(-2), rel=1e-6)


def test_cider_by_hand():
    # Two images, one reference each, so every reference n-gram has df = 1 and IDF log(2) - log(1).
    # Image 1: "red bus" vs "red car": unigram vectors [red, bus]·[red, car] -> cosine 1/2 (the clipped
    # numerator counts only "red"), no shared bigram, no 3-/4-grams -> 10 · mean(0.5, 0, 0, 0) = 1.25.
    # Image 2: "blue sky" = its reference: cosine 1 for n = 1, 2; nothing for n = 3, 4 -> 10 · 0.5 = 5.
    got = classic.classic_score("cider", ["red bus", "blue sky"], [["red car"], ["blue sky"]], tokenizer="none")
    np.testing.assert_allclose(got.values, [1.25, 5.0], rtol=1e-12)
    # one image: every IDF is log(1/1) = 0, so CIDEr is 0 — and the warning says why
    one = classic.classic_score("cider", ["blue sky"], [["blue sky"]], tokenizer="none")
    assert one.values.tolist() == [0.0] and "one image: CIDEr is 0" in one.warnings[0]


@needs_java
def test_simple_tokenizer_matches_ptb_on_ordinary_captions():
    texts = CANDS + [r for rs in REFS for r in rs] + ["It's 3.5 m (tall), isn't it?", "U.S. flag -- waving."]
    assert [classic.simple_tokenize(t) for t in texts] == classic.tokenize(texts)


def test_without_java_meteor_and_ptb_say_so(monkeypatch):
    monkeypatch.setattr(classic.shutil, "which", lambda name: None)
    with pytest.raises(CapscoreError, match="METEOR needs Java.*default-jre-headless"):
        classic.classic_score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="PTB tokenisation.*needs Java"):
        classic.classic_score("bleu4", ["a dog"], [["a dog"]])
    # the documented fallback works without Java
    assert classic.classic_score("bleu1", ["A dog."], [["a dog"]], tokenizer="simple").values[0] == pytest.approx(1.0)


def test_spice_without_corenlp_jars_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSCORE_SPICE_DIR", str(tmp_path))
    if classic.corenlp_dir() is not None:
        pytest.skip("CoreNLP jars are installed here")
    with pytest.raises(CapscoreError, match=f"stanford-corenlp-3.6.0.jar.*put them in {tmp_path}"):
        classic.classic_score("spice", ["a dog"], [["a dog"]], tokenizer="none")


def test_bad_input_is_named():
    with pytest.raises(CapscoreError, match="differ in length"):
        classic.classic_score("bleu1", ["a", "b"], [["a"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="caption 1: a reference-based metric needs at least one"):
        classic.classic_score("bleu1", ["a", "b"], [["a"], []], tokenizer="none")
    with pytest.raises(CapscoreError, match="did you mean 'cider'"):
        classic.classic_score("ciderr", ["a"], [["a"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="'tokenizer' parameter"):
        classic.classic_score("bleu1", ["a"], [["a"]], tokenizer="moses")


# ------------------------------------------------------------------------------------ in `capscore correlate`
@needs_java
def test_correlate_prints_classic_and_clip_rows_with_significance(tmp_path, capsys):
    import json

    from scipy import stats as st

    from capscore.cli import main
    from capscore.meta.datasets import load_dataset
    from capscore.meta.significance import williams_test

    out = tmp_path / "out"
    assert main(["-q", "correlate", "--dataset", "scenes-oracle", "--scenes", "8", "--metric", "bleu4", "rouge-l",
                 "clip-s", "--model", "capscore-test-tiny", "--bootstrap", "50", "--no-cache", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bleu4" in text and "rouge-l" in text and "clip-s" in text
    assert "Williams test p-values" in text and "cluster (not significantly different" in text
    doc = json.loads((out / "correlate.json").read_text())
    items = [json.loads(ln) for ln in (out / "correlate_items.jsonl").read_text().splitlines()]
    by = {m: {it["id"]: it["score"] for it in items if it["metric"] == m} for m in ("bleu4", "rouge-l", "clip-s")}
    human = {it["id"]: it["human"] for it in items}
    # the bleu4 column equals pycocoevalcap on the dataset's captions and references (PTB-tokenised)
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    ds = load_dataset("scenes-oracle", n_scenes=8)
    tok = PTBTokenizer()
    gts = tok.tokenize({it.record.id: [{"caption": r} for r in it.record.refs] for it in ds.items})
    res = tok.tokenize({it.record.id: [{"caption": it.record.caption}] for it in ds.items})
    _, per = Bleu(4).compute_score(gts, res, verbose=0)
    np.testing.assert_allclose([by["bleu4"][k] for k in gts], per[3], rtol=1e-12)
    ids = list(human)
    tau = 100 * st.kendalltau([by["bleu4"][i] for i in ids], [human[i] for i in ids], variant="b")[0]
    assert doc["results"][0]["metric"] == "bleu4" and doc["results"][0]["stats"][0]["value"] == pytest.approx(tau)
    sig = doc["significance"]
    assert sig["names"] == ["bleu4", "rouge-l", "clip-s"] and sig["n_resamples"] == 50 and sig["n_clusters"] == 8
    w = williams_test([by["clip-s"][i] for i in ids], [by["bleu4"][i] for i in ids], [human[i] for i in ids])
    assert sig["williams_p"][2][0] == pytest.approx(w.p_value)


@needs_java
def test_score_pipeline_gives_cider_its_whole_set_idf(tmp_path):
    """`capscore score` / capscore.score: CIDEr over the whole evaluated set even when the pipeline's chunks and
    batches are smaller than the set (the reference code computes the IDF once over all of it)."""
    from PIL import Image

    from capscore.data.records import Record
    from capscore.data.sources import InMemory
    from capscore.pipeline import Encoding, ScoreJob, iter_rows

    recs = []
    for i, (c, rs) in enumerate(zip(CANDS, REFS)):
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(tmp_path / f"{i}.png")
        recs.append(Record.make(f"c{i}", tmp_path / f"{i}.png", c, rs))
    job = ScoreJob(source=InMemory(tuple(recs)), models=("capscore-test-tiny",), metrics=("cider", "bleu4"),
                   encoding=Encoding(batch_size=2, cache=False), chunk_size=2, progress=False)
    rows = list(iter_rows(job))
    want = classic.classic_scores(["cider", "bleu4"], CANDS, REFS)
    np.testing.assert_allclose([r["score"] for r in rows if r["metric"] == "cider"], want["cider"].values, rtol=1e-12)
    np.testing.assert_allclose([r["score"] for r in rows if r["metric"] == "bleu4"], want["bleu4"].values, rtol=1e-12)
