"""Hostile inputs to the meta-evaluation surfaces: paired tests, compare, correlate, judgment files, reproduce,
doctor and report.

Each case either gives the right number (derived here by hand, from scipy or by a loop written out) or one
``capscore: error:`` line naming the file, line or item, exit 2. No non-finite number is printed as a result.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from scipy import stats as sst

from capscore.cli import main
from capscore.errors import CapscoreError, InputError
from test_hostile_inputs import assert_one_error, run  # one-line error checks, shared

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def no_non_finite(text: str) -> None:
    """No printed number is inf or nan (a word such as 'info' is not a number)."""
    assert not re.search(r"(?<![A-Za-z])(-?inf|nan)(?![A-Za-z])", text, re.IGNORECASE), text


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ============================================================================ paired tests between systems
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("meta")
    (d / "images").mkdir()
    colours = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (250, 250, 10), (10, 250, 250), (250, 10, 250)]
    for i, c in enumerate(colours):
        Image.new("RGB", (32, 32), c).save(d / "images" / f"im{i}.png")
    words = ["red", "green", "blue", "yellow", "cyan", "magenta"]
    d_rows = [{"image": f"im{i}.png", "caption": f"a {words[(i * 2) % 6]} square"} for i in range(6)]
    return {"d": d, "rows": d_rows}


def score_run(world, out: Path, *files: Path) -> tuple[int, str, dict]:
    code = main(["-q", "score", "--model", "scenes-tiny", "--images", str(world["d"] / "images"), "--captions",
                 *map(str, files), "--out", str(out), "--no-cache"])
    summary = json.loads(Path(str(out) + ".summary.json").read_text())
    return code, summary


def test_a_reordered_copy_of_one_file_differs_by_exactly_zero(world, tmp_path, capsys):
    """Ids from line numbers name different images in the two files; the captions are paired by image, so a
    reordered copy of a file is the same system: difference 0, p = 1 for both tests."""
    (tmp_path / "copy").mkdir()
    a = write_rows(tmp_path / "sysA.jsonl", world["rows"])
    b = write_rows(tmp_path / "copy" / "sysB.jsonl", world["rows"][::-1])
    code, summary = score_run(world, tmp_path / "o.jsonl", a, b)
    out = capsys.readouterr().out
    assert code == 0
    (t,) = summary["system_tests"]
    assert (t["a"], t["b"], t["match"], t["paired"]) == ("sysA", "sysB", "image", 6)
    boot, ar = t["tests"]
    assert boot["delta"] == 0 and boot["ci"] == [0, 0] and boot["p_value"] == 1 and ar["p_value"] == 1
    assert "paired tests between systems" in out and "left out" not in out


def test_explicit_ids_naming_different_images_are_left_out_with_the_reason(world, tmp_path, capsys):
    rows = [{"id": f"c{i}", **r} for i, r in enumerate(world["rows"])]
    b_rows = [{"id": f"c{i}", **r} for i, r in enumerate(world["rows"][::-1])]
    a, b = write_rows(tmp_path / "A.jsonl", rows), write_rows(tmp_path / "B.jsonl", b_rows)
    code, summary = score_run(world, tmp_path / "o.jsonl", a, b)
    out = capsys.readouterr().out
    (t,) = summary["system_tests"]
    assert code == 0 and "tests" not in t
    assert "id 'c0' names" in t["left_out"] and "im0.png in A but" in t["left_out"] and "im5.png in B" in t["left_out"]
    assert "left out of the paired tests: A vs B" in out and "id 'c0' names" in out


def test_pairing_rules_by_hand():
    from capscore.meta.compare import system_tests

    def rows(system, triples):
        return [{"id": i, "image": m, "score": s, "system": system, "model": "m", "metric": "clip-s"}
                for i, m, s in triples]

    a = rows("A", [("x1", "i1", 0.9), ("x2", "i2", 0.5), ("x3", "i3", 0.1)])
    b = rows("B", [("x1", "i1", 0.8), ("x2", "i2", 0.2), ("x3", "i3", 0.4), ("x4", "i4", 0.7)])
    (t,) = system_tests(a + b, n_resamples=50)
    assert (t["match"], t["paired"], t["only_a"], t["only_b"]) == ("id", 3, 0, 1)
    assert t["tests"][0]["delta"] == pytest.approx(((0.9 - 0.8) + (0.5 - 0.2) + (0.1 - 0.4)) / 3)
    # positional ids with several captions of one image, in another order: cannot be paired
    a = rows("A", [("1", "i1", 0.9), ("2", "i1", 0.5), ("3", "i2", 0.1)])
    b = rows("B", [("1", "i2", 0.8), ("2", "i1", 0.2), ("3", "i1", 0.4)])
    (t,) = system_tests(a + b, n_resamples=50)
    assert "line numbers" in t["left_out"] and "several captions of i1" in t["left_out"]
    # an error row keeps its line number: the ids 1..3 of A are still positional
    a = rows("A", [("1", "i1", None), ("2", "i2", 0.5), ("3", "i3", 0.1)])
    b = rows("B", [("1", "i3", 0.3), ("2", "i2", 0.2), ("3", "i1", 0.4)])
    (t,) = system_tests(a + b, n_resamples=50)
    assert (t["match"], t["paired"]) == ("image", 2)
    assert t["tests"][0]["delta"] == pytest.approx(((0.5 - 0.2) + (0.1 - 0.3)) / 2)
    # one image in common: nothing to resample, said so
    (t,) = system_tests(rows("A", [("q", "i1", 0.3)]) + rows("B", [("q", "i1", 0.2)]), n_resamples=50)
    assert "1 image(s) in common" in t["left_out"]


# ============================================================================ compare
def test_compare_refuses_different_metrics_models_and_systems(tmp_path, capsys):
    base = [{"id": f"c{i}", "image": f"i{i}", "caption": "x", "score": 0.1 * i} for i in range(4)]
    a = write_rows(tmp_path / "clip.jsonl", [{**r, "model": "ViT-B-32", "metric": "clip-s"} for r in base])
    b = write_rows(tmp_path / "bleu.jsonl", [{**r, "model": "-", "metric": "bleu4"} for r in base])
    code, _, err = run(["compare", a, b], capsys)
    assert_one_error(code, err, "clip.jsonl", "'clip-s'", "bleu.jsonl", "'bleu4'", "same metric")
    mixed = write_rows(tmp_path / "mixed.jsonl", [{**r, "model": "m", "metric": "clip-s"} for r in base[:2]]
                       + [{**r, "model": "m", "metric": "pac-s"} for r in base[2:]])
    code, _, err = run(["compare", mixed, a], capsys)
    assert_one_error(code, err, "mixed.jsonl:3", "'pac-s'", "mixed.jsonl:1", "'clip-s'")
    two = write_rows(tmp_path / "two.jsonl", [{**r, "system": "s1"} for r in base[:2]]
                     + [{**r, "system": "s2"} for r in base[2:]])
    code, _, err = run(["compare", two, a], capsys)
    assert_one_error(code, err, "two.jsonl:3", "system 's2'", "one system per file")


def test_compare_of_scores_near_the_float_limit_is_one_line_not_inf(tmp_path, capsys):
    a = write_rows(tmp_path / "a.jsonl", [{"id": "x", "image": "1", "score": 1e308},
                                          {"id": "y", "image": "2", "score": -1e308},
                                          {"id": "z", "image": "3", "score": 0.5}])
    b = write_rows(tmp_path / "b.jsonl", [{"id": "x", "image": "1", "score": -1e308},
                                          {"id": "y", "image": "2", "score": 1e308},
                                          {"id": "z", "image": "3", "score": 0.2}])
    code, out, err = run(["compare", a, b, "--resamples", "50"], capsys)
    assert_one_error(code, err, "a.jsonl", "b.jsonl", "overflow")
    no_non_finite(out)


@pytest.mark.parametrize("argv,names", [
    (["--resamples", "1000000000000"], ["--resamples", "10,000,000"]),
    (["--resamples", "0"], ["--resamples"]),
    (["--seed", "-1"], ["--seed"]),
])
def test_compare_option_bounds(argv, names, tmp_path, capsys):
    a = write_rows(tmp_path / "a.jsonl", [{"id": f"c{i}", "image": str(i), "score": i} for i in range(3)])
    code, _, err = run(["compare", a, a, *argv], capsys)
    assert_one_error(code, err, *names)


def test_resampling_in_blocks_draws_what_one_array_would(monkeypatch):
    """The bootstrap and randomisation draw their resamples block by block; with tiny blocks the results
    equal a loop written out with one (R, G) array of draws."""
    from capscore.meta import significance as sig

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=30), rng.normal(size=30)
    clusters = [i // 3 for i in range(30)]
    monkeypatch.setattr(sig, "BLOCK", 7)
    boot, ar = sig.compare_systems(a, b, clusters=clusters, n_resamples=101, seed=5)
    sums = np.bincount(clusters, weights=a - b)
    sizes = np.bincount(clusters).astype(float)
    draws = np.random.default_rng(5).integers(0, 10, size=(101, 10))
    ref = sums[draws].sum(1) / sizes[draws].sum(1)
    delta = sums.sum() / sizes.sum()
    assert boot.p_value == pytest.approx(np.mean(np.abs(ref - delta) >= abs(delta)))
    assert boot.ci == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])))
    signs = np.random.default_rng(5).integers(0, 2, size=(101, 10)) * 2 - 1
    perm = (signs * sums).sum(1) / sizes.sum()
    assert ar.p_value == pytest.approx((np.sum(np.abs(perm) >= abs(delta) - 1e-12) + 1) / 102)


def test_resample_counts_are_bounded_in_the_library():
    from capscore.meta.significance import paired_bootstrap
    from capscore.meta.stats import bootstrap_ci

    with pytest.raises(CapscoreError, match="n_resamples.*10,000,000"):
        paired_bootstrap([1.0, 2.0], [2.0, 1.0], n_resamples=10**12)
    with pytest.raises(CapscoreError, match="n_resamples"):
        bootstrap_ci(np.mean, (np.arange(5.0),), n_resamples=10**12)


# ============================================================================ p-values
@pytest.mark.parametrize("p,resamples,text", [
    (0.0, 1000, "< 0.001"), (1 / 1001, 1000, "< 0.001"), (0.001, 1000, "0.001"), (0.5, 1000, "0.500"),
    (1 / 10001, 10000, "< 0.0001"), (0.0123, 10000, "0.0123"), (0.2, 100, "0.200"),
    (0.0004, None, "< 0.001"), (0.042, None, "0.042"), (None, 1000, "n/a"), (float("nan"), None, "n/a"),
])
def test_p_values_never_claim_more_resolution_than_their_resamples(p, resamples, text):
    from capscore._table import format_p

    assert format_p(p, resamples) == text


def test_compare_prints_p_below_one_over_r(tmp_path, capsys):
    """A large clear difference: the bootstrap p is 0 and the randomisation p its floor 1/(R + 1); both read
    '< 0.001' with 1000 resamples, never 0.000."""
    rows_a = [{"id": f"c{i}", "image": str(i), "score": 1.0 + 0.01 * i} for i in range(40)]
    rows_b = [{"id": f"c{i}", "image": str(i), "score": 0.01 * i} for i in range(40)]
    a, b = write_rows(tmp_path / "a.jsonl", rows_a), write_rows(tmp_path / "b.jsonl", rows_b)
    code, out, _ = run(["compare", a, b, "--resamples", "1000"], capsys)
    assert code == 0 and out.count("< 0.001") == 2 and "0.000 " not in out and "0.0000" not in out.split("A wins")[1]


# ============================================================================ correlate
def test_correlations_of_scores_near_the_float_limit_are_finite_and_right(tmp_path, capsys):
    x = np.array([1e308, -1e308, 0.5, 1e307, -3e307])
    h = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    scores = write_rows(tmp_path / "s.jsonl", [{"id": str(i), "score": float(v)} for i, v in enumerate(x)])
    human = write_rows(tmp_path / "h.jsonl", [{"id": str(i), "score": float(v)} for i, v in enumerate(h)])
    code, out, err = run(["correlate", "--scores", scores, "--human", human, "--stats", "pearson",
                          "one_minus_r2_fit", "--bootstrap", "0", "--out", tmp_path / "c"], capsys)
    assert code == 0, err
    no_non_finite(out)
    r = sst.pearsonr(x / 1e308, h).statistic  # r does not change when x is scaled
    got = {s["name"]: s["value"] for s in json.loads((tmp_path / "c" / "correlate.json").read_text())
           ["results"][0]["stats"]}
    assert got["pearson"] == pytest.approx(100 * r) and got["one_minus_r2_fit"] == pytest.approx(100 * (1 - r * r))
    code, _, err = run(["correlate", "--scores", scores, "--human", human, "--stats", "one_minus_r2"], capsys)
    assert_one_error(code, err, "one_minus_r2", "too large")


def test_williams_test_on_scores_near_the_float_limit():
    from capscore.meta.significance import williams_test

    rng = np.random.default_rng(0)
    h = rng.normal(size=20)
    m1, m2 = h + rng.normal(scale=0.5, size=20), h + rng.normal(scale=1.0, size=20)
    small = williams_test(m1, m2, h)
    big = williams_test(m1 * 1e307, m2 * 1e307, h)
    assert math.isfinite(big.p_value) and big.p_value == pytest.approx(small.p_value)


@pytest.mark.parametrize("argv,names", [(["--bootstrap", "100000000000"], ["--bootstrap"]),
                                        (["--seed", "-4"], ["--seed"])])
def test_correlate_option_bounds(argv, names, tmp_path, capsys):
    code, _, err = run(["correlate", "--dataset", "scenes-oracle", *argv], capsys)
    assert_one_error(code, err, *names)


# ============================================================================ judgment files
def _flickr(tmp_path: Path, ratings, name="flickr8k.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"img1": {"image_path": "a.jpg", "ground_truth": ["a ref"], "human_judgement": [
        {"caption": f"caption {j}", "rating": r, "image_path": "a.jpg"} for j, r in enumerate(ratings)]}}))
    return p


@SETTINGS
@given(r=st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_expert_ratings_outside_1_to_4_name_the_judgement(tmp_path, r):
    from capscore.meta.datasets import load_flickr8k

    p = _flickr(tmp_path, [2.0, r])
    if 1 <= r <= 4:
        assert [it.human for it in load_flickr8k(p, None).items] == [2.0, r]
    else:
        with pytest.raises(InputError, match=r"flickr8k\.json: key 'img1', judgement 1: 'rating' is outside the "
                                             r"dataset's scale \[1, 4\]"):
            load_flickr8k(p, None)


@SETTINGS
@given(r=st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_crowdflower_shares_outside_0_to_1_name_the_judgement(tmp_path, r):
    from capscore.meta.datasets import load_flickr8k

    p = _flickr(tmp_path, [r], "crowdflower_flickr8k.json")
    if 0 <= r <= 1:
        assert [it.human for it in load_flickr8k(p, None, variant="crowdflower").items] == [r]
    else:
        with pytest.raises(InputError, match=r"judgement 0: 'rating' is outside the dataset's scale \[0, 1\]"):
            load_flickr8k(p, None, variant="crowdflower")


@SETTINGS
@given(key=st.text(min_size=1, max_size=12), nested=st.booleans())
def test_a_key_given_twice_in_a_judgment_json_is_an_error_naming_it(tmp_path, key, nested):
    """Property: json keeps the last of two equal keys without a word; the loader refuses the file and names
    the key, whether it is an entry's key or a field inside an entry."""
    from capscore.meta.datasets import load_flickr8k

    fields = '"image_path": "a.jpg", "ground_truth": [], "human_judgement": []'
    k = json.dumps(key)
    if nested:  # a field of one entry named twice (if it is image_path, three times: still the first repeat)
        text = '{"img": {' + fields + ", " + k + ": 1, " + k + ": 2}}"
    else:  # one entry's key twice
        text = "{" + k + ": {" + fields + "}, " + k + ": {" + fields + "}}"
    p = tmp_path / "flickr8k.json"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_flickr8k(p, None)
    assert "flickr8k.json" in str(e.value) and repr(key)[:40] in str(e.value) and "appears twice" in str(e.value)


@pytest.mark.parametrize("row,names", [
    ('{"image": "a.jpg", "caption": "x", "score": 1, "score": 4}', ["j.jsonl:2", "'score' appears twice"]),
    ('{"image": "a.jpg", "caption": "x", "caption": "y", "score": 1}', ["j.jsonl:2", "'caption' appears twice"]),
])
def test_a_key_given_twice_in_a_jsonl_row_names_the_line(tmp_path, row, names):
    from capscore.meta.datasets import load_generic

    p = tmp_path / "j.jsonl"
    p.write_text('{"image": "b.jpg", "caption": "ok", "score": 2}\n' + row + "\n")
    with pytest.raises(InputError) as e:
        load_generic(p, None)
    for n in names:
        assert n in str(e.value)


def test_a_csv_header_naming_a_column_twice_is_an_error(tmp_path):
    from capscore.meta.datasets import load_composite, load_generic

    p = tmp_path / "g.csv"
    p.write_text("image,caption,score,score\na.jpg,x,1,4\n")
    with pytest.raises(InputError, match=r"g\.csv:1: the column 'score' appears twice in the header"):
        load_generic(p, None)
    c = tmp_path / "c.csv"
    c.write_text("imgid,cand,refs,score,imgid\nx.jpg,a cat,[],3,y.jpg\n")
    with pytest.raises(InputError, match=r"c\.csv:1: the column 'imgid' appears twice"):
        load_composite(c, None)


@pytest.mark.parametrize("score,ok", [("7", False), ("-3", False), ("5", True), ("0.25", True), ("5.01", False)])
def test_composite_scores_outside_0_to_5(tmp_path, score, ok):
    from capscore.meta.datasets import load_composite

    p = tmp_path / "composite.csv"
    p.write_text(f"imgid,cand,refs,score\nx.jpg,a cat,\"['a dog']\",2\ny.jpg,a cow,\"['a pig']\",{score}\n")
    if ok:
        assert [it.human for it in load_composite(p, None).items] == [2.0, float(score)]
    else:
        with pytest.raises(InputError, match=r"composite\.csv:3: 'score' is outside the dataset's scale \[0, 5\]"):
            load_composite(p, None)


def test_composite_duplicate_ids(tmp_path):
    from capscore.meta.datasets import load_composite

    p = tmp_path / "composite.csv"
    p.write_text("id,imgid,cand,refs,score\nq,x.jpg,a cat,[],2\nq,y.jpg,a cow,[],3\n")
    with pytest.raises(InputError, match=r"composite\.csv:3: duplicate id 'q'"):
        load_composite(p, None)


@pytest.mark.parametrize("votes,ok", [((5, 1), True), ((5.0, 1), True), ((2.5, 1), False), ((-1, 3), False),
                                      (("nan", 3), False), ((5, "x"), False)])
def test_pascal_votes_are_whole_numbers(tmp_path, votes, ok):
    from capscore.meta.datasets import load_pascal50s

    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"image": "y.jpg", "a": "one", "b": "two", "category": "HC", "refs": ["r"],
                             "votes_a": votes[0], "votes_b": votes[1]}) + "\n")
    if ok:
        assert load_pascal50s(p, None).items[0].votes == (5, 1)
    else:
        with pytest.raises(InputError, match=r"p\.jsonl:1: 'votes_[ab]' must"):
            load_pascal50s(p, None)


def test_foil_flags_and_image_ids_are_checked(tmp_path):
    from capscore.meta.datasets import load_foil

    coco = tmp_path / "captions_val2014.json"
    coco.write_text(json.dumps({"annotations": [{"image_id": 1, "caption": "a man"}]}))
    foil = tmp_path / "foil.json"
    ann = [{"id": 7, "image_id": 1, "caption": "a man", "foil": False},
           {"id": 7, "image_id": 1, "caption": "a cow", "foil": "false"}]
    foil.write_text(json.dumps({"images": [], "annotations": ann}))
    with pytest.raises(InputError, match=r"foil\.json: annotation 1: 'foil' must be true or false"):
        load_foil(foil, None, coco_captions=coco)
    ann[1]["foil"], ann[1]["image_id"] = True, 2
    foil.write_text(json.dumps({"images": [], "annotations": ann}))
    with pytest.raises(InputError, match=r"annotation 1: annotation id 7 names image 2 here and 1"):
        load_foil(foil, None, coco_captions=coco)
    for a in ann:
        a["image_id"] = "abc"
    foil.write_text(json.dumps({"images": [], "annotations": ann}))
    coco.write_text(json.dumps({"annotations": [{"image_id": "abc", "caption": "a man"}]}))
    with pytest.raises(InputError, match=r"image_id names no entry of 'images' and is not a COCO number"):
        load_foil(foil, None, coco_captions=coco)


def test_correlate_on_a_judgment_file_with_a_duplicate_key_is_one_line(tmp_path, capsys):
    p = tmp_path / "flickr8k.json"
    entry = json.dumps({"image_path": "a.jpg", "ground_truth": ["r"], "human_judgement": [
        {"caption": "c", "rating": 2, "image_path": "a.jpg"}]})
    p.write_text('{"k1": ' + entry + ', "k1": ' + entry + "}")
    code, _, err = run(["correlate", "--dataset", "flickr8k-expert", "--path", p, "--model", "scenes-tiny"], capsys)
    assert_one_error(code, err, "flickr8k.json", "'k1'", "appears twice")


# ============================================================================ reproduce and doctor
HEADER = "dataset,split,metric,backbone,model,statistic,paper,tolerance,source\n"


@pytest.mark.parametrize("row,names", [
    ("flickr8k-expert,test,clip-s,x,-,tau_c,nan,0.5,s", ["t.csv:2", "'paper'", "nan"]),
    ("flickr8k-expert,test,clip-s,x,-,tau_c,inf,0.5,s", ["t.csv:2", "'paper'"]),
    ("flickr8k-expert,test,clip-s,x,-,tau_c,51,-0.5,s", ["t.csv:2", "'tolerance'", ">= 0"]),
    ("flickr8k-expert,test,clip-s,x,-,tau_c,51,nan,s", ["t.csv:2", "'tolerance'"]),
    ("flickr8k-expert,test,clip-s,x,-,tau_c,51", ["t.csv:2", "malformed CSV row"]),
])
def test_reproduce_tables_with_values_that_cannot_be_compared(tmp_path, capsys, row, names):
    t = tmp_path / "t.csv"
    t.write_text(HEADER + row + "\n")
    code, _, err = run(["reproduce", t, "--data-root", tmp_path], capsys)
    assert_one_error(code, err, *names)


def test_reproduce_that_runs_no_row_fails(tmp_path, capsys):
    t = tmp_path / "t.csv"
    t.write_text(HEADER + "flickr8k-expert,test,clip-s,x,-,tau_c,51,0.5,s\n")
    (tmp_path / "data" / "flickr8k").mkdir(parents=True)
    (tmp_path / "data" / "flickr8k" / "flickr8k.json").write_bytes(b"")  # present but empty
    code, out, err = run(["reproduce", t, "--data-root", tmp_path / "data"], capsys)
    assert_one_error(code, err, "no row of", "t.csv", "data file is empty (0 bytes)")
    assert "skipped flickr8k-expert" in out


def test_doctor_does_not_call_empty_or_fake_jars_present(tmp_path, capsys, monkeypatch):
    from capscore.scores.classic import CORENLP_JARS, jar_problem

    monkeypatch.setenv("CAPSCORE_SPICE_DIR", str(tmp_path))
    for j in CORENLP_JARS:
        (tmp_path / j).write_bytes(b"")
    code, out, _ = run(["doctor", "--data-root", tmp_path / "d", "--weights-root", tmp_path / "w"], capsys)
    line = next(ln for ln in out.splitlines() if "CoreNLP" in ln)
    assert code == 0 and "MISSING" in line and "empty (0 bytes)" in line
    (tmp_path / CORENLP_JARS[0]).write_text("<html>404 Not Found</html>")
    assert jar_problem(tmp_path / CORENLP_JARS[0]).startswith("not a jar")
    import zipfile

    for j in CORENLP_JARS:
        with zipfile.ZipFile(tmp_path / j, "w") as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    code, out, _ = run(["doctor", "--data-root", tmp_path / "d", "--weights-root", tmp_path / "w"], capsys)
    line = next(ln for ln in out.splitlines() if "CoreNLP" in ln)
    assert "present" in line and str(tmp_path) in line


# ============================================================================ report
def _score_rows(folder: Path, scores: list[float], name="s.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_rows(folder / name, [{"id": str(i), "image": f"i{i}.png", "caption": "c", "system": "A",
                                       "model": "m", "metric": "clip-s", "score": s} for i, s in enumerate(scores)])


def test_report_on_scores_near_the_float_limit_renders_without_non_finite_numbers(tmp_path, capsys):
    _score_rows(tmp_path / "r", [1e308, -1e308, 1e308, 0.5])
    code, _, err = run(["report", tmp_path / "r", "--out", tmp_path / "p.html"], capsys)
    assert code == 0, err
    page = (tmp_path / "p.html").read_text()
    assert "overflow 64-bit floats" in page and "wider than 64-bit floats can bin" in page
    no_non_finite(re.sub(r"<[^>]+>|data:image/png;base64,[^\"]+", " ", page))


def test_report_on_a_summary_whose_rows_file_is_a_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "s.jsonl").mkdir()
    (tmp_path / "s.jsonl.summary.json").write_text(json.dumps({"metric": "clip-s", "runs": [], "status": "complete"}))
    code, _, err = run(["report", tmp_path, "--out", tmp_path / "p.html"], capsys)
    assert_one_error(code, err, "s.jsonl", "is a folder")
    assert not (tmp_path / "p.html").exists()


@pytest.mark.parametrize("command", [["compare", "A", "A", "--resamples"], ["correlate", "--dataset", "scenes-oracle",
                                                                           "--metric", "bleu1", "--bootstrap"]])
def test_too_few_resamples_for_a_95_percent_interval_are_one_warning(command, tmp_path):
    """1 to 39 resamples: the run goes on and says once that a 95 % interval's 2.5 % tails need 40; 40 says
    nothing (checked on compare)."""
    import os
    import subprocess
    import sys

    a = write_rows(tmp_path / "a.jsonl", [{"id": f"c{i}", "image": str(i), "score": i} for i in range(3)])
    argv = [str(a) if x == "A" else x for x in command]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}

    def warnings_of(n: str) -> list[str]:  # parsing only (--help): the warning comes from the option itself
        proc = subprocess.run([sys.executable, "-m", "capscore", *argv, n, "--help"], capture_output=True,
                              text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stderr.splitlines() if "warning" in line]

    assert warnings_of("1") == [
        "capscore: warning: 1 resample is too few for a 95% interval (each 2.5% tail needs at least 40); its ends "
        "are the extreme resamples; use 1000 or more"]
    if command[0] == "compare":  # the same option type serves both: one start of the heavier correlate
        assert warnings_of("40") == []
