"""Probe metrics on tiny hand-made similarity tables; SPECS segmentation of example captions."""
import math

import numpy as np
import pytest

from capscore.probes import metrics as M
from capscore.probes.segment import detail_units


# ------------------------------------------------------------------ LGIP
def test_invariance_error_by_hand():
    orig = [0.30, 0.50]
    para = [0.28, 0.35, 0.50, 0.44]
    owner = [0, 0, 1, 1]
    # |0.30-0.28| + |0.30-0.35| + |0.50-0.50| + |0.50-0.44| = 0.02 + 0.05 + 0 + 0.06 = 0.13; / 4
    assert M.invariance_error(orig, para, owner) == pytest.approx(0.0325)


def test_flip_gap_and_positive_rate_by_hand():
    orig = [0.30, 0.50]
    flip = [0.20, 0.31, 0.50, 0.40]
    owner = [0, 0, 1, 1]
    s = M.flip_sensitivity(orig, flip, owner)
    # gaps: 0.10, -0.01, 0.00 (tie: not positive), 0.10
    assert s.gap_mean == pytest.approx(0.19 / 4)
    assert s.positive_rate == pytest.approx(0.5)
    assert s.count == 4
    by = M.flip_sensitivity_by_type(orig, flip, owner, ["color", "object", "color", "count"])
    assert by["color"].positive_rate == pytest.approx(0.5) and by["color"].gap_mean == pytest.approx(0.05)
    assert by["object"].positive_rate == 0.0 and by["count"].positive_rate == 1.0


def test_empty_tables_are_nan_not_zero():
    assert math.isnan(M.invariance_error([0.3], [], []))
    assert M.flip_sensitivity([0.3], [], []).count == 0


# ------------------------------------------------------------------ SPECS specificity rate
NAN = float("nan")
PREFIX = [
    [0.20, 0.25, 0.24, 0.30],  # steps: up, down, up -> SR_pos 2/3
    [0.10, 0.20, 0.30],  # up, up -> 1
    [0.50, 0.60],  # 1 step: up -> 1
]
WRONG = [
    [0.19, 0.26, 0.20],  # prefix beats wrong: yes, no, yes -> 2/3
    [0.05, NAN],  # one valid step: yes -> 1
    [0.40],  # yes -> 1
]


def test_specificity_rates_triplets_and_images_by_hand():
    r = M.specificity_rates(PREFIX, WRONG)
    # eq. 1 as printed: 5 of the 6 positive triplets go up; per image: (2/3 + 1 + 1) / 3
    assert r.pos.triplets == pytest.approx(5 / 6) and r.pos.n_triplets == 6 and r.pos.n_correct == 5
    assert r.pos.images == pytest.approx((2 / 3 + 1 + 1) / 3) and r.pos.n_images == 3 and r.pos.n_skipped == 0
    # eq. 2 (the prose's direction): 4 of 5 valid negative triplets go down (the NaN step is not a triplet)
    assert r.neg.triplets == pytest.approx(4 / 5) and r.neg.n_triplets == 5
    assert r.neg.images == pytest.approx((2 / 3 + 1 + 1) / 3)
    assert r.mean_triplets == pytest.approx((5 / 6 + 4 / 5) / 2)


def test_specificity_min_steps_skips_images_from_the_image_mean_only_and_counts_them():
    r = M.specificity_rates(PREFIX, WRONG, min_steps=2)
    assert r.pos.images == pytest.approx((2 / 3 + 1) / 2) and r.pos.n_skipped == 1 and r.pos.n_images == 2
    assert r.neg.images == pytest.approx(2 / 3) and r.neg.n_skipped == 2
    assert r.pos.triplets == pytest.approx(5 / 6) and r.neg.triplets == pytest.approx(4 / 5)  # still every triplet


def test_specificity_unknown_variant_is_refused():
    with pytest.raises(Exception, match="'variant' parameter"):
        M.specificity_rates(PREFIX, WRONG, variant="paper")


# ------------------------------------------------------------------ LGIP: pairs (reference code) vs captions (eqs. 4-8)
def test_lgip_pairs_and_captions_averages_by_hand():
    orig = [0.30, 0.50]
    para, powner = [0.28, 0.35, 0.50], [0, 0, 1]  # |diffs| 0.02, 0.05 | 0.00
    assert M.invariance_error(orig, para, powner) == pytest.approx(0.07 / 3)
    assert M.invariance_error(orig, para, powner, average="captions") == pytest.approx((0.035 + 0.0) / 2)
    flip, fowner = [0.20, 0.31, 0.40], [0, 0, 1]  # gaps 0.10, -0.01 | 0.10
    s = M.flip_sensitivity(orig, flip, fowner)
    assert s.gap_mean == pytest.approx(0.19 / 3) and s.positive_rate == pytest.approx(2 / 3)
    c = M.flip_sensitivity(orig, flip, fowner, average="captions")
    assert c.gap_mean == pytest.approx((0.045 + 0.10) / 2) and c.positive_rate == pytest.approx((0.5 + 1) / 2)
    assert c.count == 3 and c.n_captions == 2


# ------------------------------------------------------------------ suites
def test_i2t_with_several_true_captions_and_ties():
    S = np.array([[0.5, 0.4, 0.3]])
    assert M.i2t_correct(S)
    assert M.i2t_correct(S, [(0, 1)])  # SugarCrepe++ ITT: both positives beat the negative
    assert not M.i2t_correct(np.array([[0.5, 0.2, 0.3]]), [(0, 1)])
    assert not M.i2t_correct(np.array([[0.4, 0.4]]))  # a tie fails


def test_winoground_by_hand():
    # rows = images, cols = captions
    S = np.array([[0.9, 0.1], [0.95, 0.2]])
    w = M.winoground(S)
    # text: 0.9>0.1 yes; 0.2>0.95 no -> False. image: c0: 0.9>0.95 no -> False
    assert (w.text, w.image, w.group) == (False, False, False)
    S = np.array([[0.6, 0.5], [0.4, 0.7]])
    assert M.winoground(S) == M.WinogroundScore(True, True, True)
    S = np.array([[0.6, 0.5], [0.65, 0.7]])  # text ok; image: c0 0.6 > 0.65 no
    assert M.winoground(S) == M.WinogroundScore(True, False, False)


def test_sugarcrepe_pp_tot():
    assert M.sugarcrepe_pp_tot(0.9, 0.8, 0.7)
    assert not M.sugarcrepe_pp_tot(0.9, 0.95, 0.7)


def test_aro_macro_accuracy_drops_small_groups():
    correct = [True] * 20 + [False] * 5 + [True] * 3 + [False] * 27 + [True]
    groups = ["on"] * 25 + ["under"] * 30 + ["rare"]
    g = M.macro_accuracy(correct, groups, min_count=25)
    assert g.macro == pytest.approx((20 / 25 + 3 / 30) / 2)
    assert g.micro == pytest.approx(24 / 56)
    assert g.excluded_groups == ("rare",) and g.n_groups == 2


# ------------------------------------------------------------------ SPECS detail units
@pytest.mark.parametrize("caption,units", [
    ("A front view of a statue on cement in a park.", ["A front view of a statue on cement", "in a park."]),
    ("The bus is parked near the station.", ["The bus is parked near the station."]),
    ("In the background, a man is riding a horse.", ["In the background, a man is riding a horse."]),
    ("A dog.", ["A dog."]),
    ("The image shows a kitchen with white cabinets, a stainless steel refrigerator, and a wooden table.",
     ["The image shows a kitchen with white cabinets,", "a stainless steel refrigerator,", "and a wooden table."]),
    ("A cat sleeps on a sofa. A lamp stands next to the window.",
     ["A cat sleeps on a sofa.", "A lamp stands next to the window."]),
])
def test_detail_units(caption, units):
    assert detail_units(caption) == units


def test_units_tile_the_caption():
    cap = "A woman wearing a white hat holds an umbrella while walking down a busy street at night."
    units = detail_units(cap)
    assert " ".join(units) == cap and len(units) >= 2


@pytest.mark.parametrize("caption,units", [
    # chunks: "A dog lies on a rug" (PP attached, rule 2) | "near the sofa," (2nd PP: not attached) |
    # "beside the lamp" | "a black cat." -- rule 3: "near the sofa," is led by a PP and has no verb, so it joins
    # what follows; the merged unit is still PP-led without a verb, so it joins "a black cat." too
    ("A dog lies on a rug near the sofa, beside the lamp a black cat.",
     ["A dog lies on a rug", "near the sofa, beside the lamp a black cat."]),
    # "near a door," joins "in a parked car" (rule 3); the merged unit contains a verb (parked/VBN, VERB), so it
    # stops there and "a man waits." stays a unit of its own
    ("A dog sits on a mat near a door, in a parked car a man waits.",
     ["A dog sits on a mat", "near a door, in a parked car", "a man waits."]),
])
def test_merge_rule_3_applies_to_any_segment_led_by_a_pp(caption, units):
    """SPECS §4.2 rule (3), "segments which start with a prepositional phrase", not only sentence-initially."""
    assert detail_units(caption) == units


@pytest.mark.parametrize("caption,paper,ours", [
    # Penn tags: Two/CD people/NNS are/VBP walking/VBG along/IN a/DT sandy/JJ beach/NN at/IN sunset/NN ./.
    # App. A: NP = people, a sandy beach, sunset (CD is no determiner there); VP needs NPs to the sentence end
    # ($) and never fires before "."; PP = along NP, at NP -> units "Two people" | "are walking along a sandy
    # beach" | "at sunset" | "." -> rule 2 attaches "at sunset" (first PP of that unit), "." joins it.
    ("Two people are walking along a sandy beach at sunset.",
     ["Two people", "are walking along a sandy beach at sunset."],
     # capscore: CLAUSE "Two people are walking", PPs "along a sandy beach" (attached), "at sunset" (2nd: split)
     ["Two people are walking along a sandy beach", "at sunset."]),
    # the paper's Fig. 1 example: App. A keeps "with fringed edges" inside one unit
    ("The cat is partially tucked under a blanket with fringed edges.",
     ["The cat is partially tucked under a blanket with fringed edges."],
     ["The cat is partially tucked under a blanket", "with fringed edges."]),
])
def test_detail_units_paper_grammar_vs_capscore(caption, paper, ours):
    assert detail_units(caption, grammar="paper") == paper
    assert detail_units(caption) == ours
