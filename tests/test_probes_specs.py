"""SPECS reference evaluation: the SR bookkeeping of the authors' specs.py / compute_increments and the
negatives of their data/create_dci.py, against hand computations and an independent re-implementation of
their logic written here (zero-padded pair arrays, as their evaluation script stores them)."""
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from capscore.probes import metrics as M
from capscore.probes.formats import ProbeItem
from capscore.probes.run import reference_wrong_units, run_specificity


def authors_rates(prefix_scores, wrong_scores):
    """What the authors' evaluation prints per image, re-implemented: each image's (prefix, negative) score
    pairs are zipped into a zero-padded (images, most prefixes, 2) array -- K prefixes, K - 1 negatives, so
    the last prefix is never stored -- then n = (positive stored prefix scores) - 1; images with n <= 1 are
    left out; SR_pos = share of the first n steps that rise, SR_neg = share of the first n prefix scores
    above their negative's."""
    width = max(len(p) for p in prefix_scores)
    table = np.zeros((len(prefix_scores), width, 2))
    for r, (p, w) in enumerate(zip(prefix_scores, wrong_scores)):
        for c, pair in enumerate(zip(p, w)):
            table[r, c] = pair
    pos, neg = [], []
    for row in table:
        sim, wrong = row[:, 0], row[:, 1]
        n = np.count_nonzero(sim > 0) - 1
        if n > 1:
            pos.append(np.count_nonzero(np.diff(sim)[:n] > 0) / n)
            neg.append(np.count_nonzero((sim - wrong)[:n] > 0) / n)
    return pos, neg


def test_the_issue_case_reference_vs_capscore():
    prefix, wrong = [[0.2, 0.25, 0.3, 0.35, -0.01]], [[0.1, 0.3, 0.2, 0.4]]
    ref = M.specificity_rates(prefix, wrong, variant="reference")
    # stored prefixes .2 .25 .3 .35 (s(P_5) never stored): 4 positive -> 3 steps; negatives .1 .3 .2:
    # .2 > .1 yes, .25 > .3 no, .3 > .2 yes -> 2/3; rises: 3 of 3
    assert ref.neg.images == pytest.approx(2 / 3) and ref.neg.triplets == pytest.approx(2 / 3)
    assert ref.neg.n_triplets == 3 and ref.pos.n_triplets == 3 and ref.pos.images == pytest.approx(1.0)
    assert authors_rates(prefix, wrong) == ([1.0], [pytest.approx(2 / 3)])
    own = M.specificity_rates(prefix, wrong)  # every step: the fourth compares .35 with -.01 (fall) and .4 (no)
    assert own.neg.triplets == pytest.approx(0.5) and own.neg.n_triplets == 4
    assert own.pos.triplets == pytest.approx(0.75) and own.pos.n_triplets == 4


def test_reference_scores_at_or_below_zero_are_values():
    # negatives <= 0 count as lower (0.2 > -0.05, 0.3 > -0.2); a prefix score -0.01 inside the chain is a value
    r = M.specificity_rates([[0.2, 0.25, 0.3, 0.35, 0.4]], [[-0.05, 0.3, -0.2, 0.1]], variant="reference")
    assert r.neg.images == pytest.approx(2 / 3) and r.neg.n_triplets == 3
    # stored .2 -.01 .25 .3: 3 positive -> 2 steps: .2 -> -.01 falls, -.01 -> .25 rises; .2 > .1, -.01 < .3
    r = M.specificity_rates([[0.2, -0.01, 0.25, 0.3, 0.35]], [[0.1, 0.3, 0.2, 0.1]], variant="reference")
    assert r.pos.images == pytest.approx(0.5) and r.neg.images == pytest.approx(0.5) and r.pos.n_triplets == 2
    # 2 positive stored scores -> 1 step -> skipped from both rates, and counted
    r = M.specificity_rates([[0.2, 0.3, -0.1, -0.2, 0.5]], [[0.1, 0.1, 0.1, 0.1]], variant="reference")
    assert r.pos.n_images == 0 and r.pos.n_skipped == 1 and r.neg.n_skipped == 1 and np.isnan(r.pos.images)


def test_reference_rates_equal_the_authors_logic_on_random_chains():
    rng = np.random.default_rng(7)
    prefix, wrong = [], []
    for _ in range(300):
        k = int(rng.integers(1, 10))
        prefix.append(rng.uniform(-0.2, 0.6, k).round(3).tolist())
        wrong.append(rng.uniform(-0.3, 0.6, k - 1).round(3).tolist())
    pos, neg = authors_rates(prefix, wrong)
    r = M.specificity_rates(prefix, wrong, variant="reference")
    assert len(pos) > 100 and r.pos.n_skipped == len(prefix) - len(pos)
    np.testing.assert_allclose(r.pos.per_image, pos)
    np.testing.assert_allclose(r.neg.per_image, neg)
    assert r.pos.images == pytest.approx(np.mean(pos)) and r.neg.images == pytest.approx(np.mean(neg))


# ------------------------------------------------------------------ negatives (create_dci.py)
def _segs():
    # item j's units are "u{j}.{t}", so a drawn unit names the caption and the index it came from
    lengths = [5, 1, 3, 6, 2, 4, 5, 1]
    return [[f"u{j}.{t}" for t in range(n)] for j, n in enumerate(lengths)]


def test_reference_negatives_one_new_other_image_per_step_with_the_last_unit_fallback():
    segs = _segs()
    keys = ["a", "b", "c", "d", "e", "f", "a", "g"]  # items 0 and 6 show the same image
    drawn = reference_wrong_units(segs, keys, [f"s|{i}" for i in range(len(segs))])
    sources = set()
    for i, row in enumerate(drawn):
        assert len(row) == len(segs[i]) - 1  # one negative per step t = 1..K-1
        for t, unit in enumerate(row):
            j, idx = (int(x) for x in unit[1:].split("."))
            assert keys[j] != keys[i]  # another image's caption (never 0 <-> 6)
            assert idx == min(t, len(segs[j]) - 1)  # its unit at index t-1 of step t, or its last
            sources.add((i, j))
    assert len({j for i, j in sources if i == 3}) > 1  # drawn anew for each step
    assert {j for _, j in sources} == set(range(len(segs)))  # every caption can be drawn
    assert drawn == reference_wrong_units(segs, keys, [f"s|{i}" for i in range(len(segs))])  # seeded


def test_reference_negatives_draw_uniformly_among_other_images_captions_with_units():
    # the authors redraw random.randint(0, len(ds) - 1) until the image differs: a uniform draw over the other
    # images' captions. Item 0 (image "a") has 4 steps per seed; captions 1 and 2 show image "a" too, caption 3
    # has no unit (their [i] would fail on it), so every draw is caption 4 or 5, each about half of the time.
    segs = [["x0", "x1", "x2", "x3", "x4"], ["y0", "y1"], ["z0"], [], ["p0", "p1", "p2"], ["q0"]]
    keys = ["a", "a", "a", "b", "c", "d"]
    drawn = [u for s in range(500) for u in reference_wrong_units(segs, keys, [f"{s}|{i}" for i in range(6)])[0]]
    assert len(drawn) == 2000 and set(drawn) == {"p0", "p1", "p2", "q0"}
    from_p = sum(u.startswith("p") for u in drawn)
    assert abs(from_p - 1000) < 4 * (2000 * 0.25) ** 0.5  # binomial(2000, 1/2) within 4 sd
    # step t (0-based) takes unit t of caption 4 while it has one, then its last; caption 5 always its only unit
    rows = [reference_wrong_units(segs, keys, [f"{s}|{i}" for i in range(6)])[0] for s in range(50)]
    per_step = [{row[t] for row in rows} for t in range(4)]
    assert per_step == [{"p0", "q0"}, {"p1", "q0"}, {"p2", "q0"}, {"p2", "q0"}]


def test_reference_negatives_without_another_image_are_none():
    assert reference_wrong_units([["x", "y", "z"], ["p", "q"]], ["a", "a"], ["s0", "s1"]) == [[None, None], [None]]


def _words_tokenize(texts):
    """A fake tokenizer: one token per word, plus the start and end tokens."""
    return [[0] * (len(t.split()) + 2) for t in texts]


def _probe(items, variant, units, **kw):
    """run_specificity with a scorer that scores each text by its CRC-32: the rows show what was scored."""
    enc = SimpleNamespace(backbone=SimpleNamespace(spec="fake", identity="fake", tokenize=_words_tokenize))

    def scorer(encoder, images, texts):
        return torch.tensor([zlib.crc32(t.encode()) % 1000 / 1000 - 0.1 for t in texts], dtype=torch.float64)

    return run_specificity(enc, items, scorer=scorer, scorer_name="hash", seed=3, units=units, variant=variant, **kw)


def test_run_specificity_reference_builds_the_authors_negatives_and_rates():
    segs = _segs()
    items = [ProbeItem(f"i{j}", f"img{j % 7}.png", " ".join(us)) for j, us in enumerate(segs)]  # 0 and 7 share
    res = _probe(items, "reference", segs)
    prefix, wrong = [], []
    for row, us in zip(res.rows, segs):
        assert len(row["wrong"]) == len(us) - 1
        for t, text in enumerate(row["wrong"]):
            head, unit = text.rsplit(" ", 1)
            assert head == " ".join(us[: t + 1])  # P_t + the drawn unit
            j, idx = (int(x) for x in unit[1:].split("."))
            assert j % 7 != int(row["id"][1:]) % 7 and idx == min(t, len(segs[j]) - 1)
        prefix.append(row["prefix_scores"])
        wrong.append(row["wrong_scores"])
    pos, neg = authors_rates(prefix, wrong)
    s = res.summary[0]
    assert s["variant"] == "reference" and s["sr_pos_images"] == pytest.approx(np.mean(pos))
    assert s["sr_neg_images"] == pytest.approx(np.mean(neg)) and s["n_images_pos"] == len(pos) >= 3


def _authors_join(units, neg_units, max_len):
    """The authors' join_segmented_captions re-derived: start from the first unit; per step the next prefix and
    the negative (the current prefix + the drawn unit) are both added, unless either has more than max_len
    tokens (here: words + 2), which ends the caption."""
    n = lambda text: len(text.split()) + 2  # noqa: E731
    merged, negs = [units[0]], []
    for piece, neg in zip(units[1:], neg_units):
        nxt, bad = f"{merged[-1]} {piece}", f"{merged[-1]} {neg}"
        if n(nxt) > max_len or n(bad) > max_len:
            break
        merged.append(nxt)
        negs.append(bad)
    return merged, negs


@pytest.mark.parametrize("max_tokens", [4, 7, 9, 12, 1000])
def test_reference_chains_end_where_the_authors_builder_ends_them(max_tokens):
    # units of 1 to 3 words, so a negative (another caption's unit) can be longer or shorter than the next prefix;
    # with 4 tokens every chain stops at P_1 (P_2 has at least 2 words + 2)
    segs = [["a b", "c", "d e f", "g", "h i"], ["x y z", "w", "v u"], ["p", "q r s", "t"], ["m n", "o"]]
    items = [ProbeItem(f"i{j}", f"img{j}.png", " ".join(us)) for j, us in enumerate(segs)]
    res = _probe(items, "reference", segs, max_tokens=max_tokens)
    unlimited = _probe(items, "reference", segs, max_tokens=None).rows  # the same draws (seeded), every step
    for row, full, us in zip(res.rows, unlimited, segs):
        assert full["units_kept"] == len(us) and len(full["wrong"]) == len(us) - 1
        drawn = [w[len(" ".join(us[: t + 1])) + 1 :] for t, w in enumerate(full["wrong"])]
        merged, negs = _authors_join(us, drawn, max_tokens)
        assert row["units_kept"] == len(merged) == len(row["prefix_scores"])
        assert row["wrong"] == negs
    assert res.params["max_tokens"] == max_tokens


def test_reference_chain_length_by_hand():
    from capscore.probes.run import reference_chain_length

    # token counts of P_1..P_3 and of the negatives of steps 1 and 2; limit 6
    assert reference_chain_length([3, 4, 5], [9, 5], 6) == 1  # the negative of step 1 is too long: P_1 only
    assert reference_chain_length([3, 4, 5], [5, 9], 6) == 2
    assert reference_chain_length([3, 4, 7], [5, 5], 6) == 2  # P_3 too long
    assert reference_chain_length([3, 4, 5], [None, None], 6) == 3  # no negative: the prefix alone decides
    assert reference_chain_length([10, 4], [5], 6) == 2  # P_1 is never checked (the authors start from it)


def test_reference_max_tokens_must_be_positive():
    from capscore.errors import CapscoreError

    segs = [["a", "b"], ["c", "d"]]
    items = [ProbeItem(f"i{j}", f"img{j}.png", " ".join(us)) for j, us in enumerate(segs)]
    for bad in (0, -5, 2.5, True):
        with pytest.raises(CapscoreError, match="'max_tokens' parameter of run_specificity"):
            _probe(items, "reference", segs, max_tokens=bad)


# ------------------------------------------------------------------ detail units, grammar="reference"
@pytest.mark.parametrize("caption, units", [
    # first sentence: no "." before it, so neither the "The" rule nor the leading-preposition rule applies and
    # the cut before "there" stays; second sentence: led by "In" (any case) without "is"/"are": every cut joins
    ("To the left of the car there is a box. In the corner, a tall lamp stands next to an old wooden chair.",
     ["To the left of the car", "there is a box.", "In the corner, a tall lamp stands next to an old wooden chair."]),
    # no cut before "of", "on", "in": the paper's example (a) comes out as one unit
    ("A front view of a statue on cement in a park.", ["A front view of a statue on cement in a park."]),
    # "The dog barks" (3 words since the "." starting with "The") joins what follows; "is" joins the unit before
    ("The cat sleeps. The dog barks loudly at the mailman, who is standing by the gate.",
     ["The cat sleeps.", "The dog barks loudly at the mailman", ", who is", "standing", "by the gate."]),
    # a cut after every "." character, inside a number or an abbreviation too; "..." gives one-dot units
    ("A 3.5 inch screen sits on the desk... Behind it, Mr. Smith's coffee mug is half empty.",
     ["A 3.", "5 inch screen sits on the desk.", ".", ".", "Behind it, Mr.", "Smith's coffee mug is", "half empty."]),
])
def test_reference_grammar_by_hand(caption, units):
    from capscore.probes.segment import detail_units

    assert detail_units(caption, grammar="reference") == units


def _authors_postprocess(segments: list[str]) -> list[str]:
    """The authors' post-processing re-implemented on their string form (segments joined with " | ")."""
    join = set("behind in under on to above left right next up down out of 's is".split())
    text = (" | ".join(segments) + " |").replace("| . |", ".").replace("| .", ".").replace(". |", ".")
    i = 0
    while i < len(text):
        if text[i] == "|":
            dot = text.rfind(".", 0, i)
            since = text[dot + 1 : i - 1].split() if 0 <= dot < i - 2 else []
            rest = text[i + 2 :]
            nxt = rest[: rest.find(" ")] if " " in rest else None
            if ((since and len(since) <= 3 and since[0] == "The") or nxt in join
                    or (since and since[0].lower() in join and "is" not in since and "are" not in since)):
                text = text[:i] + text[i + 2 :]
        i += 1
    return [c.strip() for c in text.replace(".", ".|").split("|") if c.strip()]


def test_reference_grammar_equals_the_authors_string_procedure_on_the_same_chunks():
    from capscore.probes.segment import _chunk, detail_units, load_parser
    from capscore.scenes import generate_scenes

    nlp = load_parser()
    captions = [s.long_caption() for s in generate_scenes(40, seed=5, split="train")] + [
        "On the table, a red apple is next to a knife. Up in the sky are two birds. The image's left side is dark.",
        "Out of focus, the background shows trees. The man is holding a cup of tea in his left hand.",
    ]
    for caption in captions:
        segments = []
        for sent in nlp(caption).sents:
            toks = [t for t in sent if not t.is_space]
            cur = []
            for node in _chunk([t.tag_ for t in toks], "reference"):
                cur += [t.text for t in toks[node.start : node.end]]
                if node.label in "npvs":
                    segments.append(" ".join(cur))
                    cur = []
            if cur:
                segments.append(" ".join(cur))
        expected = [u.replace(" ", "") for u in _authors_postprocess(segments)]
        assert [u.replace(" ", "") for u in detail_units(caption, nlp=nlp, grammar="reference")] == expected, caption
