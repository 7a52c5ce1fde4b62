"""PR-MCS perturbations and LGIP variants against hand-written expectations."""
import random

import pytest

from capscore.perturb import flips, lgip_variants, paraphrases, perturb, split_words
from capscore.errors import CapscoreError

CAP = "a dog chases a cat on the grass"


# ------------------------------------------------------------------ PR-MCS, p = 1 and p = 0: no randomness involved
def test_p1_repetition_removal_masking():
    assert perturb("a dog runs", "repetition", p=1.0).text == "a a dog dog runs runs"
    assert perturb("a dog runs", "masking", p=1.0, mask="<m>").text == "<m> <m> <m>"
    # Algorithm 1: removal keeps the drawn words -> with every word drawn nothing is removed
    r = perturb("a dog runs", "removal", p=1.0)
    assert r.text is None and r.unchanged
    r = perturb("a dog runs", "removal", p=1.0, removal="drop-drawn")  # §5.2 prose reading
    assert r.text is None and not r.unchanged and "empty" in r.reason  # reported, not silently dropped


def test_p0_leaves_the_caption_unchanged_as_algorithm_1():
    r = perturb("a dog runs", "masking", p=0.0)
    assert not r.ok and r.unchanged and "no word drawn" in r.reason
    r = perturb("a dog runs", "removal", p=0.0)  # Algorithm 1 would emit an empty caption
    assert not r.ok and not r.unchanged


def test_p0_ensure_change_forces_exactly_one_word():
    # ensure_change: no draw succeeded -> one index from rng.randrange(n) after Algorithm 1's 2 draws per word
    rng = random.Random("0|rep_rem_mask|a dog runs")
    [rng.random() for _ in range(6)]
    k = rng.randrange(3)
    words = ["a", "dog", "runs"]
    words[k] = "[MASK]"
    assert perturb("a dog runs", "masking", p=0.0, ensure_change=True).text == " ".join(words)


class _Seq:
    """A stand-in generator returning a fixed sequence of numbers."""

    def __init__(self, xs):
        self.xs = list(xs)

    def random(self):
        return self.xs.pop(0)


def test_algorithm_1_draws_by_hand():
    # p = 0.4 -> threshold 0.6. Word a: 0.7 > 0.6 drawn. b: 0.1 not drawn, then the elif draw 0.9 (unused).
    # c: 0.65 drawn. d: 0.6 is not > 0.6, then 0.2. Drawn: a, c. (Without the elif draw, b would get 0.1,
    # c 0.9 and d 0.65: drawn c, d -- a different caption.)
    seq = [0.7, 0.1, 0.9, 0.65, 0.6, 0.2]
    assert perturb("a b c d", "repetition", rng=_Seq(seq)).text == "a a b c c d"
    assert perturb("a b c d", "masking", rng=_Seq(seq)).text == "[MASK] b [MASK] d"
    assert perturb("a b c d", "removal", rng=_Seq(seq)).text == "a c"  # Alg. 1 keeps the drawn words
    assert perturb("a b c d", "removal", rng=_Seq(seq), removal="drop-drawn").text == "b d"


@pytest.mark.parametrize("seed", [0, 1, 7, 11])
def test_repetition_removal_masking_share_one_draw_per_word(seed):
    rep = perturb(CAP, "repetition", seed=seed)
    mask = perturb(CAP, "masking", seed=seed)
    rem = perturb(CAP, "removal", seed=seed)
    words = CAP.split()
    masked = [i for i, w in enumerate(mask.text.split()) if w == "[MASK]"]
    assert set(rep.positions) == set(masked)
    assert rem.text == " ".join(words[i] for i in masked)  # removal keeps exactly the masked (drawn) words
    assert perturb(CAP, "masking", seed=seed).text == mask.text  # deterministic


def test_bad_removal_mode():
    with pytest.raises(CapscoreError, match="'removal' parameter"):
        perturb(CAP, "removal", removal="drop")


def test_jumble_changes_order_keeps_multiset():
    r = perturb(CAP, "jumble", seed=3)
    assert r.text != CAP and sorted(r.text.split()) == sorted(CAP.split())
    assert not perturb("dog dog", "jumble").ok
    assert not perturb("dog", "jumble").ok


def test_substitution_with_given_objects_swaps_them():
    assert perturb(CAP, "substitution", objects=["dog", "cat"]).text == "a cat chases a dog on the grass"
    # word boundaries: "cat" inside "category" is not an object. Algorithm 1 in sequence: the last "dog" becomes
    # "cat" ("a cat in a category"), then the last whole-word "cat" -- the one just inserted -- becomes "dog":
    # the caption comes back unchanged, and Algorithm 1 emits it as it is
    r = perturb("a dog in a category", "substitution", objects=["dog", "cat"])
    assert not r.ok and r.unchanged and "left the caption unchanged" in r.reason
    r = perturb("a dog runs", "substitution", objects=["dog"])
    assert not r.ok and r.unchanged and "fewer than two distinct" in r.reason


class FixedShuffle:
    """An rng whose shuffle puts the list in a given order (indices into the original list)."""

    def __init__(self, order):
        self.order = order

    def shuffle(self, xs):
        xs[:] = [xs[i] for i in self.order]


def test_substitution_replaces_each_object_once_in_sequence():
    """Algorithm 1's ``shuffled[j].join(target.rsplit(objects[j], 1))``: the LAST occurrence, once, step by step.
    objects [cat, dog] -> [dog, cat]: "a cat sees a dog and another dog" -> the last "cat" becomes "dog" ("a dog
    sees a dog and another dog") -> the last "dog" becomes "cat"; the other dogs stay (not every occurrence)."""
    r = perturb("a cat sees a dog and another dog", "substitution", objects=["cat", "dog"], rng=FixedShuffle([1, 0]))
    assert r.text == "a dog sees a dog and another cat"


def test_substitution_reproduces_the_papers_figures():
    from capscore.perturb.prmcs import sub_in_sent

    # Fig. 13 (DE): critical objects Packungen, Flaschen, Pralinen; Flaschen <-> Pralinen (the paper prints the
    # result with a lower-case "vor")
    de = "Vor einem weißen Hintergrund stehen mehrere Packungen und Flaschen, in den Packungen befinden sich Pralinen"
    r = perturb(de, "substitution", objects=["Packungen", "Flaschen", "Pralinen"], lang="de",
                rng=FixedShuffle([0, 2, 1]))
    assert r.text == ("Vor einem weißen Hintergrund stehen mehrere Packungen und Pralinen, in den Packungen "
                      "befinden sich Flaschen")
    # Fig. 12 (FR)
    fr_objs = ["chat noir", "chat blanc", "matelas pour animaux de compagnie blanc et rose"]
    fr = ("Un chat noir et un chat blanc allongés ensemble sur un matelas pour animaux de compagnie blanc et rose "
          "posé sur un tapis blanc.")
    r = perturb(fr, "substitution", objects=fr_objs, lang="fr", rng=FixedShuffle([1, 2, 0]))
    assert r.text == ("Un chat blanc et un matelas pour animaux de compagnie blanc et rose allongés ensemble sur un "
                      "chat noir posé sur un tapis blanc.")
    # Fig. 14 (JA): six objects, one a substring of another (スマホ in 黒いフレームのスマホ); substrings, as rsplit
    ja_objs = ["黒いフレームのスマホ", "空と海のような青色と黄色", "黒い陸", "人影", "紫色のタッチペン", "スマホ"]
    ja = ("無地の白色を背景として、黒いフレームのスマホがあり、画面には空と海のような青色と黄色に黒い陸と人影が浮かんでいて、"
          "紫色のタッチペンがスマホに立てかけられている。")
    shuffled = ["空と海のような青色と黄色", "黒い陸", "黒いフレームのスマホ", "紫色のタッチペン", "スマホ", "人影"]
    assert sub_in_sent(ja, ja_objs, shuffled) == (
        "無地の白色を背景として、空と海のような青色と黄色があり、画面には黒い陸に黒いフレームのスマホと紫色のタッチペンが浮かんでいて、"
        "スマホが人影に立てかけられている。")


@pytest.mark.parametrize("lang,caption", [
    ("de", "eine Frau sitzt an einem Tisch mit einem Kuchen"),
    ("fr", "une femme assise à une table avec un gâteau"),
    ("es", "una mujer sentada en la mesa con un pastel"),
    ("ja", "ケーキの載ったテーブルの横に座っている1人の女性"),
])
def test_non_english_without_objects_is_never_parsed_with_the_english_model(lang, caption, monkeypatch):
    """PR-MCS Fig. 8's transcreated captions: no critical objects in the data and no parser for the language ->
    not perturbable, with the reason; the English spaCy model is never loaded for them."""
    import capscore.perturb.prmcs as P

    def no_english(*a, **k):
        raise AssertionError("the English parser was used on a non-English caption")

    monkeypatch.setattr(P, "_spacy", no_english)
    r = perturb(caption, "substitution", lang=lang)
    assert not r.ok and not r.unchanged
    assert "no critical objects" in r.reason and lang in r.reason


def test_non_english_with_critical_objects_or_its_own_parser(monkeypatch):
    import capscore.perturb.prmcs as P

    monkeypatch.setattr(P, "_spacy", lambda *a, **k: (_ for _ in ()).throw(AssertionError("English parser used")))
    # es: objects from the data; hombre <-> palo, casco stays: the last "hombre" -> "palo", then the last "palo"
    # (the original one, after "un") -> "hombre"
    es = "un hombre con un casco sostiene un palo"
    r = perturb(es, "substitution", objects=["hombre", "casco", "palo"], lang="es", rng=FixedShuffle([2, 1, 0]))
    assert r.text == "un palo con un casco sostiene un hombre"
    # ja without spaces and without lang: not English, not parsed
    r = perturb("犬が猫を追う", "substitution")
    assert not r.ok and "unspaced text" in r.reason

    class Tok:  # a German "parser" passed by the caller: its nouns are the objects
        def __init__(self, text, pos):
            self.text, self.pos_ = text, pos

    de_nlp = lambda s: [Tok(w, "NOUN" if w[0].isupper() else "DET") for w in s.split()]
    r = perturb("eine Frau sitzt an einem Tisch", "substitution", lang="de", nlp=de_nlp, rng=FixedShuffle([1, 0]))
    assert r.text == "eine Tisch sitzt an einem Frau"


def test_english_nouns_still_come_from_spacy():
    assert perturb("a dog chases a cat", "substitution", lang="en").text == "a cat chases a dog"
    assert perturb("a dog chases a cat", "substitution", lang="en-GB").text == "a cat chases a dog"


def test_substitution_with_spacy_nouns_changes_caption():
    r = perturb("a dog chases a cat", "substitution", seed=0)
    assert r.text == "a cat chases a dog"
    r = perturb("a dog runs quickly", "substitution")
    assert not r.ok  # one noun only: reported as not perturbable


def test_unknown_kind_and_bad_p():
    with pytest.raises(CapscoreError, match="did you mean 'jumble'"):
        perturb(CAP, "jumbel")
    with pytest.raises(CapscoreError, match="'p' parameter"):
        perturb(CAP, "masking", p=1.5)


# ------------------------------------------------------------------ Japanese (no spaces): characters are units
def test_japanese_units_and_perturbations():
    ja = "犬が猫を追う"
    assert split_words(ja).units == ("犬", "が", "猫", "を", "追", "う") and split_words(ja).sep == ""
    assert perturb(ja, "repetition", p=1.0).text == "犬犬がが猫猫をを追追うう"
    assert perturb(ja, "masking", p=1.0, mask="＿").text == "＿＿＿＿＿＿"
    assert perturb(ja, "substitution", objects=["犬", "猫"]).text == "猫が犬を追う"
    j = perturb(ja, "jumble", seed=5).text
    assert j != ja and sorted(j) == sorted(ja)


def test_japanese_with_parser_tokens():
    toks = lambda s: ["犬", "が", "猫", "を", "追う"]  # a parser's segmentation
    assert perturb("犬が猫を追う", "repetition", p=1.0, tokenizer=toks).text == "犬犬がが猫猫をを追う追う"


# ------------------------------------------------------------------ LGIP
def test_paraphrases_templates_dedupe_and_cap():
    all_p = paraphrases("a dog", k_same=None)
    assert all_p == ("a photo of a dog", "an image of a dog", "a picture of a dog", "a dog in the scene",
                     "a scene showing a dog", "In this image, a dog", "In the picture, a dog",
                     "This image shows a dog")  # "{}" == original is dropped
    capped = paraphrases("a dog", rng=random.Random(0))
    assert len(capped) == 6 and set(capped) <= set(all_p)
    assert paraphrases("x", templates=("{}", "{}!", "ab {}"), k_same=None) == ()  # too short (< 5 chars)


def test_flips_respect_word_boundaries():
    assert flips("a redwood forest") == ()
    assert flips("a cathedral at night") == ()
    f = flips("a red car", rng=random.Random(0))
    types = {x.type for x in f}
    assert types == {"color", "object"}
    for x in f:
        assert x.text != "a red car"
        assert x.text.split()[1 if x.type == "color" else 2] == x.new
    assert {x.old for x in f} == {"red", "car"}


def test_flip_replaces_first_match_only():
    f = [x for x in flips("red car and red bus", per_type=None, k_diff=None) if x.type == "color"]
    assert len(f) == 10  # every other color, once
    assert all(x.text.endswith("car and red bus") for x in f)


def test_user_lists_and_cap():
    v = lgip_variants("a wooden chair", extra_lists={"material": ["wooden", "metal", "plastic"]}, per_type=None)
    assert {f.text for f in v.flips} == {"a metal chair", "a plastic chair"}
    assert all(f.type == "material" for f in v.flips)
    many = flips("one red dog", per_type=None, k_diff=6)
    assert len(many) == 6 and len({m.text for m in many}) == 6


def test_lgip_variants_deterministic():
    assert lgip_variants("two black dogs", seed=3) == lgip_variants("two black dogs", seed=3)
