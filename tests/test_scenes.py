"""Synthetic scenes: determinism, pixels vs. graph, lexicons, splits, flaws and the oracle.

Expected values come from the pixels (colour masks, connected components, centroids), from
hand-built scenes, or from the vocabulary tables — never from the caption code under test.
"""
from __future__ import annotations


import numpy as np
import pytest
from scipy import ndimage

from capscore.errors import CapscoreError
from capscore.scenes import (
    COLOR_NAMES, COLORS, ERROR_KINDS, LANGUAGES, PATTERNS, SHAPES, SIZES, Caption, Mention, Relation, SceneObject,
    Unit, applicable_errors, generate_scenes, heldout_pairs, make_flaw, oracle, truth,
)
from capscore.scenes.graph import PATTERN_RGB, Scene, build_graph
from capscore.scenes.vocab import GRID, MOTIONS, REGIONS, RELATIONS


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(150, seed=3, split="all")


def _px(scene):
    return np.asarray(scene.render()).astype(int)


def _is(arr, rgb):
    return (arr == np.array(rgb)).all(-1)


# ------------------------------------------------------------------ determinism
def test_generator_is_deterministic_and_independent_of_n():
    a = generate_scenes(12, seed=5, split="train")
    b = generate_scenes(12, seed=5, split="train")
    assert [s.graph for s in a] == [s.graph for s in b]
    assert all(x.render().tobytes() == y.render().tobytes() for x, y in zip(a, b))
    tail = generate_scenes(4, seed=5, split="train", start=8)
    assert [s.graph for s in tail] == [s.graph for s in a[8:]]
    assert [s.id for s in tail] == [f"train-5-{i}" for i in range(8, 12)]
    other = generate_scenes(12, seed=6, split="train")
    assert [s.graph for s in other] != [s.graph for s in a]


def test_bad_arguments_are_one_line_errors():
    for kw in ({"split": "test"}, {"size": 8}, {"min_objects": 0}, {"max_objects": 9}):
        with pytest.raises(CapscoreError) as e:
            generate_scenes(2, seed=0, **kw)
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------ pixels agree with the graph
def test_centre_pixel_shows_each_objects_colour(scenes):
    checked = 0
    for s in scenes:
        px = _px(s)
        for o in s.objects:
            x, y = int(o.x * s.size), int(o.y * s.size)
            assert tuple(px[y, x]) == COLORS[o.color], (s.id, o)
            checked += 1
    assert checked > 400


def test_counts_match_connected_components(scenes):
    """Objects never touch: per colour, the number of blobs (colour or pattern pixels) holding that
    colour equals the number of objects of that colour in the graph."""
    for s in scenes:
        px = _px(s)
        blobs, n = ndimage.label(~_is(px, (110, 110, 110)))
        for color in {o.color for o in s.objects}:
            holding = set(np.unique(blobs[_is(px, COLORS[color])])) - {0}
            assert len(holding) == sum(1 for o in s.objects if o.color == color), (s.id, color)
        assert n == len(s.objects)


def test_size_and_pattern_visible_in_pixels(scenes):
    cell = 64 // GRID
    areas = {"small": [], "large": []}
    for s in scenes:
        px = _px(s)
        for o in s.objects:
            box = px[o.row * cell:(o.row + 1) * cell + 1, o.col * cell:(o.col + 1) * cell + 1]
            colour = _is(box, COLORS[o.color]).sum()
            marks = _is(box, PATTERN_RGB).sum()
            assert (marks > 0) == (o.pattern is not None), (s.id, o)
            if o.pattern is None and o.shape == "circle":
                areas[o.size].append(colour)
    # hand computation: radius 0.42 vs 0.27 of a 21.3 px cell -> pi r^2 = 251 vs 104 px
    assert 200 < np.mean(areas["large"]) < 300 and 80 < np.mean(areas["small"]) < 130


def test_relations_agree_with_pixel_centroids(scenes):
    n = 0
    for s in scenes:
        px = _px(s)
        blobs, _ = ndimage.label(~_is(px, (110, 110, 110)))
        cent = []
        for o in s.objects:
            lab = blobs[int(o.y * s.size), int(o.x * s.size)]
            ys, xs = np.nonzero(blobs == lab)
            cent.append((xs.mean(), ys.mean()))
        for i, rel, j in s.graph.relations:
            (xi, yi), (xj, yj) = cent[i], cent[j]
            ok = {"left of": xi < xj - 5, "right of": xi > xj + 5, "above": yi < yj - 5, "below": yi > yj + 5,
                  "next to": abs(yi - yj) < cell_of(s) and abs(xi - xj) < 2 * cell_of(s)}[rel]
            assert ok, (s.id, i, rel, j)
            n += 1
    assert n > 200


def cell_of(s):
    return s.size / GRID


def test_frames_move_objects_the_stated_way():
    s = generate_scenes(1, seed=11, split="all", min_objects=1, max_objects=1)[0]
    clip = s.frames(5)
    assert clip.frames[0].tobytes() == s.render().tobytes()
    o = s.objects[0]
    first, last = (np.asarray(clip.frames[k]).astype(int) for k in (0, -1))
    c0 = np.argwhere(_is(first, COLORS[o.color])).mean(0)  # (y, x)
    c1 = np.argwhere(_is(last, COLORS[o.color])).mean(0)
    direction = dict(clip.motions)[o.key]
    dy, dx = c1 - c0
    expected = {"left": dx < -2, "right": dx > 2, "up": dy < -2, "down": dy > 2}[direction]
    assert expected or (abs(dx) + abs(dy) < 1 and _at_border(o, direction)), (direction, dx, dy)
    assert clip.caption("en").startswith(f"The {o.color} {o.shape} moves {direction}")


def _at_border(o, direction):
    return {"left": o.col == 0, "right": o.col == GRID - 1, "up": o.row == 0, "down": o.row == GRID - 1}[direction]


# ------------------------------------------------------------------ languages
def test_every_lexicon_covers_every_attribute():
    tables = {"shapes": SHAPES, "colors": COLOR_NAMES, "sizes": SIZES, "patterns": PATTERNS,
              "relations": RELATIONS, "regions": REGIONS, "motions": MOTIONS}
    for code, lang in LANGUAGES.items():
        for name, keys in tables.items():
            assert set(getattr(lang, name)) == set(keys), (code, name)
        assert set(range(1, 7)) <= set(lang.numbers), code


def _word(table_value, k=0):
    v = table_value
    return v[k] if isinstance(v, tuple) else v


def test_each_attribute_word_appears_in_every_language():
    for code, lang in LANGUAGES.items():
        for shape in SHAPES:
            for color in COLOR_NAMES:
                for size in SIZES:
                    m = Mention(shape, color, 1, size, "striped")
                    text = Caption((Unit("exists", (m,)),), code).text
                    noun = _word(lang.shapes[shape])
                    assert noun in text, (code, text)
                    # the colour's stem (agreement may change its ending)
                    assert _word(lang.colors[color])[:3] in text, (code, text)
                    assert _word(lang.sizes[size])[:3] in text, (code, text)


def test_japanese_has_no_spaces_and_others_do():
    s = generate_scenes(10, seed=2, split="all", min_objects=3)
    for sc in s:
        assert " " not in sc.long_caption("ja") and " " not in sc.short_caption("ja")
        for lang in ("en", "de", "fr", "es"):
            assert " " in sc.short_caption(lang)


def test_hand_checked_translations():
    objs = (SceneObject("circle", "red", "large", None, 0, 0, 1 / 6, 1 / 6),
            SceneObject("star", "blue", "small", None, 0, 2, 5 / 6, 1 / 6))
    s = Scene("hand", 0, "all", 0, 64, build_graph(objs), False)
    t = s.translations()
    assert t["en"] == "A large red circle to the left of a small blue star."
    assert t["de"] == "Ein großer roter Kreis links von einem kleinen blauen Stern."
    assert t["fr"] == "Un grand cercle rouge à gauche d'une petite étoile bleue."
    assert t["es"] == "Un círculo rojo grande a la izquierda de una estrella azul pequeña."
    assert t["ja"] == "小さな青い星の左にある大きな赤い円。"


# ------------------------------------------------------------------ splits
def test_heldout_split_never_leaks_into_train():
    held = heldout_pairs(0)
    assert len(held) == 8 and {c for _, c in held} == set(COLOR_NAMES) and {s for s, _ in held} == set(SHAPES)
    train = generate_scenes(200, seed=9, split="train")
    assert not any(o.key in held for s in train for o in s.objects)
    rng = np.random.default_rng(0)
    for s in train[:80]:
        for kind in applicable_errors(s):
            f = make_flaw(s, kind, rng)
            named = {fact[1:3] for fact in f.flawed_caption.facts() | f.correct_caption.facts() if fact[0] == "obj"}
            assert not named & held, (s.id, kind)
    heldout = generate_scenes(100, seed=9, split="heldout")
    assert all(s.heldout and any(o.key in held for o in s.objects) for s in heldout)


# ------------------------------------------------------------------ oracle and errors
def _hand_scene():
    # red circle top-left, blue square top-middle, two green stars at the bottom
    objs = (SceneObject("circle", "red", "large", None, 0, 0, 1 / 6, 1 / 6),
            SceneObject("square", "blue", "small", "striped", 0, 1, 3 / 6, 1 / 6),
            SceneObject("star", "green", "small", None, 2, 0, 1 / 6, 5 / 6),
            SceneObject("star", "green", "small", None, 2, 2, 5 / 6, 5 / 6))
    return Scene("hand", 0, "all", 0, 64, build_graph(objs), False)


def test_truth_of_a_hand_built_scene():
    s = _hand_scene()
    expected = {
        ("total", 4),
        ("obj", "circle", "red"), ("count", "circle", "red", 1), ("size", "circle", "red", "large"),
        ("obj", "square", "blue"), ("count", "square", "blue", 1), ("size", "square", "blue", "small"),
        ("pattern", "square", "blue", "striped"),
        ("obj", "star", "green"), ("count", "star", "green", 2), ("size", "star", "green", "small"),
        ("where", "circle", "red", "top left"), ("where", "square", "blue", "top"),
        ("rel", ("circle", "red"), "left of", ("square", "blue")),
        ("rel", ("circle", "red"), "next to", ("square", "blue")),
    }
    assert truth(s) == expected


def test_oracle_precision_recall_by_hand():
    s = _hand_scene()
    red, blue = Mention("circle", "red"), Mention("square", "blue")
    good = Caption((Unit("relation", (Relation(red, "left of", blue),)),))
    # states obj+count for both (4 facts) + one relation: 5 stated, all true, 15 true facts
    o = oracle(s, good)
    assert (o.stated, o.correct, o.true) == (5, 5, 15)
    assert o.precision == 1.0 and o.recall == pytest.approx(5 / 15) and o.f1 == pytest.approx(2 * (1 / 3) / (4 / 3))
    bad = Caption((Unit("relation", (Relation(red, "right of", blue),)),))
    o = oracle(s, bad)
    assert (o.stated, o.correct) == (5, 4) and o.precision == pytest.approx(0.8)
    wrong_count = Caption((Unit("exists", (Mention("star", "green", 3, "small"),)),))
    o = oracle(s, wrong_count)  # obj, size true; count false
    assert (o.stated, o.correct) == (3, 2)


def test_every_flaw_is_false_and_its_twin_true(scenes):
    rng = np.random.default_rng(1)
    seen = set()
    for s in scenes[:100]:
        for kind in applicable_errors(s):
            f = make_flaw(s, kind, rng)
            assert oracle(s, f.correct_caption).precision == 1.0, (s.id, kind, f.correct)
            assert oracle(s, f.flawed_caption).precision < 1.0, (s.id, kind, f.flawed)
            assert f.correct != f.flawed
            for lang in LANGUAGES:  # every language realises both
                assert f.flawed_caption.realise(lang) != f.correct_caption.realise(lang)
            seen.add(kind)
    assert seen == set(ERROR_KINDS)
    with pytest.raises(CapscoreError):
        make_flaw(s, "colour", rng)


def test_attribute_swap_keeps_words_and_changes_binding(scenes):
    rng = np.random.default_rng(4)
    s = next(s for s in scenes if "attribute_swap" in applicable_errors(s))
    f = make_flaw(s, "attribute_swap", rng)
    assert sorted(f.correct.split()) == sorted(f.flawed.split())  # same bag of words, different binding


def test_bound_flaws_introduce_only_values_already_in_the_scene():
    """make_flaw(bound=True): the hand scene (red circle, blue square, two green stars) has, for each
    kind, only bound errors to choose from, listed here by hand; bound=False also draws free ones."""
    from capscore.scenes.evaluate import needs_binding

    s = _hand_scene()
    colours = {"circle": {"blue", "green"}, "square": {"red", "green"}, "star": {"red", "blue"}}
    shapes = {"red": {"square", "star"}, "blue": {"circle", "star"}, "green": {"circle", "square"}}
    counts = {("circle", "red"): 2, ("square", "blue"): 2, ("star", "green"): 1}
    extras = {(a, b) for a in ("circle", "square", "star") for b in ("red", "blue", "green")} - \
        {("circle", "red"), ("square", "blue"), ("star", "green")}
    free_seen = set()
    for r in range(40):
        for kind in ("color", "shape", "count", "hallucination"):
            f = make_flaw(s, kind, np.random.default_rng([r, 1]), bound=True)
            new = f.flawed_caption.facts() - f.correct_caption.facts()
            objs = {x[1:] for x in new if x[0] == "obj"}
            assert needs_binding(s, f), (kind, f.flawed)
            if kind == "color":
                assert len(objs) == 1 and next(iter(objs))[1] in colours[next(iter(objs))[0]]
            elif kind == "shape":
                assert len(objs) == 1 and next(iter(objs))[0] in shapes[next(iter(objs))[1]]
            elif kind == "count":
                (_, shape, colour, k), = [x for x in new if x[0] == "count"]
                assert counts[(shape, colour)] == k
            else:
                assert len(objs) == 1 and objs <= extras
            free = make_flaw(s, kind, np.random.default_rng([r, 1]))
            if not needs_binding(s, free):
                free_seen.add(kind)
    assert free_seen == {"color", "shape", "count", "hallucination"}
    # a single object has nothing to bind to: the usual draw, no error
    one = Scene("one", 0, "all", 0, 64, build_graph(_hand_scene().objects[:1]), False)
    assert not needs_binding(one, make_flaw(one, "shape", np.random.default_rng(0), bound=True))


def test_short_and_long_captions_state_only_true_facts(scenes):
    for s in scenes[:60]:
        caps = s.captions()
        assert all(oracle(s, c).precision == 1.0 for c in caps)
        recalls = [oracle(s, c).recall for c in caps[1:]]
        assert all(b > a for a, b in zip(recalls, recalls[1:]))  # every unit adds a fact
        assert s.long_caption() == " ".join(s.detail_units())
        assert all(s.short_caption() != p for p in s.paraphrases())


def test_graded_captions_cover_a_range_of_f1(scenes):
    rng = np.random.default_rng(0)
    f1 = [o.f1 for s in scenes[:40] for _, o in s.graded(rng, n=6)]
    assert min(f1) < 0.4 and max(f1) > 0.9 and len({round(x, 2) for x in f1}) > 30



def test_corrupted_units_are_false_for_every_form_including_symmetric_relations():
    """graded captions and the SPECS replication's wrong details rely on ``_corrupt`` stating something
    false; "next to" is its own converse, so reversing it would have stated a true fact."""
    import numpy as np

    from capscore.scenes import captions as C
    from capscore.scenes import generate_scenes

    forms = set()
    for i, scene in enumerate(generate_scenes(40, seed=3)):
        truth, rng = C.truth(scene), np.random.default_rng(i)
        for u in C.detail_units(scene):
            bad = C._corrupt(scene, u, rng)
            assert bad.facts() - truth, (scene.id, u, bad)
            forms.add(u.form if u.form != "relation" else u.claims[0].rel)
    assert {"total", "exists", "where", "next to"} <= forms


# ------------------------------------------------------------------ counterfactual image twins
def test_counterfactual_twin_changes_exactly_the_flawed_fact_in_facts_and_pixels(scenes):
    from capscore.scenes.captions import truth
    from capscore.scenes.graph import COUNTERFACTUAL_KINDS, counterfactual

    made = {k: 0 for k in COUNTERFACTUAL_KINDS}
    for s in scenes[:80]:
        for kind in COUNTERFACTUAL_KINDS:
            if kind not in applicable_errors(s):
                continue
            flaw = make_flaw(s, kind, np.random.default_rng([s.index, 7]))
            twin = counterfactual(s, flaw)
            if twin is None:
                continue
            made[kind] += 1
            assert flaw.flawed_caption.facts() <= truth(twin)  # the false caption is true of the twin
            assert not flaw.correct_caption.facts() <= truth(twin)  # and the true one is not
            kept = [o for o in s.objects if o in twin.objects]  # untouched objects keep their exact place
            changed = [o for o in s.objects if o not in twin.objects] + [o for o in twin.objects if o not in s.objects]
            assert changed, kind
            if kind in ("color", "shape", "attribute_swap"):
                assert len(twin.objects) == len(s.objects)
            diff = (_px(s) != _px(twin)).any(-1)
            cells = {(o.row, o.col) for o in changed}
            side = s.size / GRID
            for o in kept:
                if (o.row, o.col) in cells:
                    continue
                r0, c0 = int(o.row * side), int(o.col * side)
                assert not diff[r0:int(r0 + side), c0:int(c0 + side)].any(), (kind, s.id)
            assert diff.any()
    assert all(v >= 10 for v in made.values()), made


def test_counterfactual_train_twins_never_hold_a_heldout_pair_and_relations_are_not_edited():
    from capscore.scenes.graph import counterfactual

    held = heldout_pairs(0)
    for s in generate_scenes(60, seed=11, split="train"):
        for kind in ("color", "shape", "attribute_swap"):
            if kind in applicable_errors(s):
                twin = counterfactual(s, make_flaw(s, kind, np.random.default_rng(s.index)))
                assert twin is None or not any(o.key in held for o in twin.objects)
        for kind in ("relation", "hallucination"):
            if kind in applicable_errors(s):
                assert counterfactual(s, make_flaw(s, kind, np.random.default_rng(s.index))) is None
