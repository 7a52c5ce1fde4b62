"""Classic metrics: every per-caption value and every corpus headline equal to pycocoevalcap called directly
(PTBTokenizer + each scorer's compute_score), on hand-made, published and generated sets; the native BLEU,
ROUGE-L and CIDEr-D equal to pycocoevalcap's on arbitrary token sequences."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pycocoevalcap")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from capscore.errors import CapscoreError  # noqa: E402
from capscore.scores import classic  # noqa: E402
from classic_sets import ALL, coco_like, ptb_direct, pycoco_direct, session  # noqa: E402, F401

needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="no Java (PTB tokenizer, METEOR)")
TEXT_METRICS = ALL[:6]

CANDS = ["A man is riding a brown horse on the beach.", "Two dogs play with a red ball in the grass!",
         "a woman holding an umbrella in the rain", "The cat's sitting on a wooden table.",
         "children are playing soccer in a park"]
REFS = [["a man rides a horse along the beach", "a person riding a horse near the ocean", "a rider on a brown horse"],
        ["two dogs playing with a ball", "a pair of dogs chase a red ball on grass"],
        ["a woman with an umbrella walks in the rain", "someone holds an umbrella while it rains"],
        ["a cat sits on a table", "a grey cat on a wooden table"],
        ["kids playing football on a field", "a group of children play soccer in the park"]]


def assert_equal_to_pycoco(got, want, tol=1e-12):
    for m, (corpus, per) in want.items():
        np.testing.assert_allclose(got[m].values, per, rtol=0, atol=tol, err_msg=m)
        assert abs(got[m].corpus() - corpus) <= tol, (m, got[m].corpus(), corpus)


@needs_java
@pytest.mark.parametrize("backend", ["native", "pycocoevalcap"])
def test_every_metric_equals_pycocoevalcap_called_directly(backend, session):
    got = session.score(ALL, CANDS, REFS, backend=backend)
    assert_equal_to_pycoco(got, pycoco_direct(*ptb_direct(CANDS, REFS)))
    assert got["cider"].warnings and "5 reference set" in got["cider"].warnings[0]
    assert got["bleu4"].backend == backend and got["bleu4"].tokenizer == "ptb"


@needs_java
def test_a_thousand_captions_and_several_systems_equal_pycocoevalcap():
    """1,200 generated images, three systems (one of them the references' first sentence, one the generator's
    candidate, one another seed's candidates) scored in one session: each system's values and headlines equal
    pycocoevalcap on that system alone, with one PTB pass and one METEOR process for all of them."""
    from capscore.scores import classic_java

    cands, refs = coco_like(1200, seed=7)
    other, _ = coco_like(1200, seed=8)
    systems = {"gen": cands, "first-ref": [rs[0] for rs in refs], "other": other}
    calls, starts = [], []
    real_ptb, real_meteor = classic_java.ptb_tokenize, classic_java.Meteor.__init__

    def ptb(texts, **kw):
        calls.append(len(texts))
        return real_ptb(texts, **kw)

    def meteor(self, **kw):
        starts.append(1)
        real_meteor(self, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(classic_java, "ptb_tokenize", ptb)
    mp.setattr(classic_java.Meteor, "__init__", meteor)
    try:
        classic._PTB_MEMO.clear()
        with classic.ClassicSession() as s:
            got = s.score_systems(ALL, {k: (v, refs) for k, v in systems.items()})
    finally:
        mp.undo()
    assert len(calls) == 1 and len(starts) == 1
    for name, sys_cands in systems.items():
        gts, res = ptb_direct(sys_cands, refs)
        assert_equal_to_pycoco(got[name], pycoco_direct(gts, res))
    assert got["first-ref"]["bleu4"].corpus() > got["gen"]["bleu4"].corpus()


@needs_java
def test_the_example_gives_pycocoevalcaps_corpus_values_not_the_means(session):
    """tests/fixtures/classic_example.json (two images, five references each, good and bad captions, as the
    clipscore/pacscore example is laid out) and the corpus values pycocoevalcap prints for it — not the
    means of the per-caption values, which differ on this set."""
    doc = json.loads((Path(__file__).parent / "fixtures" / "classic_example.json").read_text())
    keys = list(doc["refs"])
    names = ["bleu1", "bleu4", "meteor", "rouge-l", "cider"]
    for which, want in doc["pycocoevalcap"].items():
        cands, refs = [doc[which][k] for k in keys], [doc["refs"][k] for k in keys]
        got = session.score(names, cands, refs)
        assert [round(got[m].corpus(), 4) for m in names] == want
        assert_equal_to_pycoco(got, pycoco_direct(*ptb_direct(cands, refs), names=names))
        assert [round(float(np.mean(got[m].values)), 4) for m in names] == doc["per_caption_means"][which]
    good = doc["per_caption_means"]["good_captions"], doc["pycocoevalcap"]["good_captions"]
    assert good[0][:3] != good[1][:3]  # BLEU-1, BLEU-4, METEOR: the mean is not the headline


@needs_java
def test_a_resample_recomputes_the_corpus_statistic_as_pycocoevalcap_would_on_it(session):
    """corpus(indices) equals pycocoevalcap's compute_score on the resampled multiset of items (each drawn
    item a separate key), for BLEU and METEOR (summed statistics) and ROUGE-L (the mean); CIDEr keeps the
    whole set's IDF, so its resample is the mean of pycocoevalcap's whole-set values at those indices."""
    cands, refs = coco_like(60, seed=11)
    got = session.score(ALL, cands, refs)
    gts, res = ptb_direct(cands, refs)
    full = pycoco_direct(gts, res, names=["cider"])
    rng = np.random.default_rng(0)
    draws = rng.integers(0, 60, size=(3, 60))
    for draw in draws:
        rgts = {j: gts[int(i)] for j, i in enumerate(draw)}
        rres = {j: res[int(i)] for j, i in enumerate(draw)}
        want = pycoco_direct(rgts, rres, names=["bleu1", "bleu2", "bleu3", "bleu4", "rouge-l", "meteor"])
        for m, (corpus, _) in want.items():
            assert abs(got[m].corpus(draw) - corpus) <= 1e-12, m
        assert got["cider"].corpus(draw) == pytest.approx(float(np.mean(full["cider"][1][draw])), abs=1e-12)
    for m in ALL:  # R resamples at once = one at a time
        np.testing.assert_allclose(got[m].corpus(draws), [got[m].corpus(d) for d in draws], rtol=0, atol=1e-12)
    with pytest.raises(CapscoreError, match="'indices' parameter"):
        got["bleu4"].corpus([0, 60])
    with pytest.raises(CapscoreError, match="'indices' parameter"):
        got["bleu4"].corpus([0.5])


@needs_java
def test_meteor_headline_is_the_jars_aggregate_on_subsets(session):
    """The jar's aggregate (pycocoevalcap's METEOR mean) reproduced from summed statistics to 1e-12 on several
    sets, including perfect one-chunk matches (whose chunk the jar does not add) and an empty caption."""
    cands, refs = coco_like(40, seed=5)
    cands[3] = refs[3][1]  # a perfect match
    cands[4] = ""
    cands[5] = "..."
    got = session.score("meteor", cands, refs)["meteor"]
    gts, res = ptb_direct(cands, refs)
    for keep in (range(40), range(0, 40, 3), [3, 3, 3], [4], [3, 4, 5, 6]):
        keep = list(keep)
        want = pycoco_direct({j: gts[i] for j, i in enumerate(keep)}, {j: res[i] for j, i in enumerate(keep)},
                             names=["meteor"])["meteor"][0]
        assert abs(got.corpus(keep) - want) <= 1e-12
    assert got.values[4] == 0.0 and got.values[5] == 0.0


# ------------------------------------------------------------------------------------ native = pycocoevalcap
WORDS = ["a", "the", "dog", "cat", "on", "grass", "red", "is", "sitting", "of", "x", "é", "日本", "'s", "-lrb-"]
sentence = st.lists(st.sampled_from(WORDS), min_size=0, max_size=14).map(" ".join)
token_sets = st.lists(st.tuples(sentence, st.lists(sentence, min_size=1, max_size=5)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token_sets, st.integers(1, 5))
def test_native_bleu_rouge_cider_equal_pycocoevalcap_on_arbitrary_tokens(items, chunk):
    """On arbitrary token sequences (empty candidates and references — the PTB tokenizer can empty a text —
    repeated n-grams, one image or many), scored a few items at a time, the native values and corpus
    headlines equal pycocoevalcap's own scorers to 1e-12."""
    from capscore.scores.classic_native import TokenSet
    from capscore.scores.classic_stats import bleu_from_stats

    cands = [c for c, _ in items]
    refs = [rs for _, rs in items]
    gts, res = {i: rs for i, rs in enumerate(refs)}, {i: [c] for i, c in enumerate(cands)}
    if not any(r.split() for rs in refs for r in rs):  # pycocoevalcap's CIDEr fails on it (max of no df)
        with pytest.raises(ValueError):
            pycoco_direct(gts, res, names=["cider"])
        assert TokenSet(cands, refs, chunk=chunk).cider_d().tolist() == [0.0] * len(cands)  # capscore's value
        return
    want = pycoco_direct(gts, res, names=TEXT_METRICS)
    ts = TokenSet(cands, refs, chunk=chunk)
    stats = ts.bleu_stats()
    for k in range(4):
        np.testing.assert_allclose(bleu_from_stats(stats)[:, k], want[f"bleu{k + 1}"][1], rtol=0, atol=1e-12)
        assert abs(bleu_from_stats(stats.sum(0))[k] - want[f"bleu{k + 1}"][0]) <= 1e-12
    np.testing.assert_allclose(ts.rouge_l(), want["rouge-l"][1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ts.cider_d(), want["cider"][1], rtol=0, atol=1e-12)
    if all(r.strip() for rs in refs for r in rs):  # the public path (it refuses blank references)
        assert_equal_to_pycoco(classic.classic_scores(TEXT_METRICS, cands, refs, tokenizer="none"), want)


def test_native_equals_pycocoevalcap_on_generated_captions():
    cands, refs = coco_like(500, seed=2)
    cands = [classic.simple_tokenize(c) for c in cands]
    refs = [[classic.simple_tokenize(r) for r in rs] for rs in refs]
    got = classic.classic_scores(TEXT_METRICS, cands, refs, tokenizer="none")
    want = pycoco_direct({i: rs for i, rs in enumerate(refs)}, {i: [c] for i, c in enumerate(cands)},
                         names=TEXT_METRICS)
    assert_equal_to_pycoco(got, want)


def test_long_captions_are_cheap_natively_and_equal_pycocoevalcap():
    """A 10,000-word candidate (bit-parallel LCS for ROUGE-L, interned n-grams for BLEU and CIDEr-D) against
    ordinary references equals pycocoevalcap; a 10,000-word caption against itself has ROUGE-L 1 and BLEU 1."""
    rng = np.random.default_rng(0)
    long = " ".join(rng.choice(WORDS[:10], size=10_000))
    cands, refs = [long, "a dog on grass"], [["a dog is sitting on the grass", "the red cat"], ["a dog on grass"]]
    got = classic.classic_scores(TEXT_METRICS, cands, refs, tokenizer="none")
    assert_equal_to_pycoco(got, pycoco_direct({i: r for i, r in enumerate(refs)}, {i: [c] for i, c in
                                                                                      enumerate(cands)},
                                              names=TEXT_METRICS))
    same = classic.classic_scores(["bleu4", "rouge-l"], [long], [[long]], tokenizer="none")
    assert same["rouge-l"].values[0] == pytest.approx(1.0, abs=1e-12)
    assert same["bleu4"].values[0] == pytest.approx(1.0, abs=1e-9)


# ------------------------------------------------------------------------------------ by hand
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
    # corpus: 7 of 8 unigrams clipped-correct, lengths 8 vs 12 -> 7/8 · exp(1 - 12/8)
    assert got["bleu1"].corpus() == pytest.approx(7 / 8 * math.exp(1 - 12 / 8), rel=1e-8)


def test_cider_by_hand():
    # Two images, one reference each, so every reference n-gram has df = 1 and IDF log(2) - log(1).
    # Image 1: "red bus" vs "red car": unigram vectors [red, bus]·[red, car] -> cosine 1/2 (the clipped
    # numerator counts only "red"), no shared bigram, no 3-/4-grams -> 10 · mean(0.5, 0, 0, 0) = 1.25.
    # Image 2: "blue sky" = its reference: cosine 1 for n = 1, 2; nothing for n = 3, 4 -> 10 · 0.5 = 5.
    got = classic.classic_score("cider", ["red bus", "blue sky"], [["red car"], ["blue sky"]], tokenizer="none")
    np.testing.assert_allclose(got.values, [1.25, 5.0], rtol=1e-12)
    assert got.corpus() == pytest.approx(3.125, abs=1e-12)
    # one image: every IDF is log(1/1) = 0, so CIDEr is 0 — and the warning says why
    one = classic.classic_score("cider", ["blue sky"], [["blue sky"]], tokenizer="none")
    assert one.values.tolist() == [0.0] and "one image: CIDEr is 0" in one.warnings[0]


def test_rouge_l_by_hand():
    # LCS("a b c d e", "a x c y e") = 3 (a c e): P = R = 3/5, F = 0.6; the best reference is taken
    got = classic.classic_score("rouge-l", ["a b c d e"], [["a x c y e", "q"]], tokenizer="none")
    assert got.values[0] == pytest.approx(0.6, abs=1e-12)


# ------------------------------------------------------------------------------------ tokenizers
@needs_java
def test_simple_tokenizer_matches_ptb_on_ordinary_captions():
    texts = CANDS + [r for rs in REFS for r in rs] + ["It's 3.5 m (tall), isn't it?", "U.S. flag -- waving."]
    assert [classic.simple_tokenize(t) for t in texts] == classic.tokenize(texts)


def test_without_java_meteor_and_ptb_say_so(monkeypatch):
    monkeypatch.setattr(classic.shutil, "which", lambda name: None)
    with pytest.raises(CapscoreError, match="METEOR needs Java.*default-jre-headless"):
        classic.classic_score("meteor", ["a dog"], [["a dog"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="PTB tokenisation.*needs Java"):
        classic.classic_score("bleu4", ["a new dog text"], [["a dog"]])
    # the documented fallback works without Java
    assert classic.classic_score("bleu1", ["A dog."], [["a dog"]], tokenizer="simple").values[0] == pytest.approx(1.0)


def test_spice_without_corenlp_jars_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSCORE_SPICE_DIR", str(tmp_path))
    if classic.corenlp_dir() is not None:
        pytest.skip("CoreNLP jars are installed here")
    with pytest.raises(CapscoreError, match=f"stanford-corenlp-3.6.0.jar.*put them in {tmp_path}"):
        classic.classic_score("spice", ["a dog"], [["a dog"]], tokenizer="none")


def test_bad_options_are_named():
    with pytest.raises(CapscoreError, match="differ in length"):
        classic.classic_score("bleu1", ["a", "b"], [["a"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="did you mean 'cider'"):
        classic.classic_score("ciderr", ["a"], [["a"]], tokenizer="none")
    with pytest.raises(CapscoreError, match="'tokenizer' parameter"):
        classic.classic_score("bleu1", ["a"], [["a"]], tokenizer="moses")
    with pytest.raises(CapscoreError, match="'backend' parameter"):
        classic.classic_score("bleu1", ["a"], [["a"]], tokenizer="none", backend="sacrebleu")


# ------------------------------------------------------------------------------------ in `capscore correlate`
@needs_java
def test_correlate_prints_classic_and_clip_rows_with_significance(tmp_path, capsys):
    from scipy import stats as st_

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
    tau = 100 * st_.kendalltau([by["bleu4"][i] for i in ids], [human[i] for i in ids], variant="b")[0]
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
    want = pycoco_direct(*ptb_direct(CANDS, REFS), names=["bleu4", "cider"])
    np.testing.assert_allclose([r["score"] for r in rows if r["metric"] == "cider"], want["cider"][1], atol=1e-12)
    np.testing.assert_allclose([r["score"] for r in rows if r["metric"] == "bleu4"], want["bleu4"][1], atol=1e-12)


def test_registry_formula_gives_values_and_the_stats_of_the_batch():
    from capscore.data.records import Record
    from capscore.scores.metric import EmbeddingBatch, get_metric

    recs = [Record.make(f"c{i}", f"img{i}.png", c, rs) for i, (c, rs) in enumerate(zip(CANDS, REFS))]
    batch = EmbeddingBatch(None, recs, "", "image", {"tokenizer": "simple", "classic_backend": "pycocoevalcap"})
    m = get_metric("bleu4")
    stats = m.image.stats(batch)
    assert stats.backend == "pycocoevalcap" and stats.tokenizer == "simple"
    assert m.compute(batch).scores == pytest.approx(list(stats.values), abs=0)
    want = classic.classic_score("bleu4", [classic.simple_tokenize(c) for c in CANDS],
                                 [[classic.simple_tokenize(r) for r in rs] for rs in REFS], tokenizer="none")
    assert stats.corpus() == pytest.approx(want.corpus(), abs=1e-12)
    assert "pycocoevalcap backend" in m.image.describe(batch.options)
