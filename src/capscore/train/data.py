"""Training examples: from user JSONL files or from capscore's synthetic scenes.

One :class:`Example` type carries every field any recipe reads; each recipe
declares the fields it needs (``Recipe.needs``) and :func:`check_fields` names the
first example that lacks one.

JSONL format (one object per line; image paths relative to the file's folder):

=================  ====================  ==================================================
field              recipes               meaning
=================  ====================  ==================================================
``image``          all                   image path
``caption``        all                   the caption (for ``specs``: the long caption)
``base``           specs (optional)      c_j, a prefix of the caption (e.g. its first sentence)
``detail``         specs (optional)      d⁺, one detail unit true of the image, appended to ``base``;
                                         without base/detail the caption is cut into detail
                                         units (SPECS §4.3: "captions, segmented as described
                                         above") and each draw takes a random prefix c_j and
                                         the next unit as d⁺ (:func:`specs_units`)
``perturbed``      prmcs (fine-tune)     perturbed captions written by people (PR-MCS §5.4,
                                         M-FineCap3k few-shot): a list (perturbations of
                                         ``caption``) or {"lang": [...]} per language; used
                                         instead of generated perturbations where present
``translations``   prmcs                 {"lang": "caption in that language", ...}
``gen_image``      pacs                  path of an image generated from ``caption``
``gen_caption``    pacs                  a caption generated for ``image``
=================  ====================  ==================================================
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from capscore.data.images import ImageRef
from capscore.data.jsonl import iter_jsonl
from capscore.errors import CapscoreError, InputError


@dataclass(frozen=True)
class Example:
    image: ImageRef
    caption: str
    base: str | None = None
    detail: str | None = None
    perturbed: tuple[str, ...] = ()
    translations: tuple[tuple[str, str], ...] = ()  # (lang, text) pairs
    gen_image: ImageRef | None = None
    gen_caption: str | None = None
    source: str = ""  # file:line or scene id, for errors
    units: tuple[str, ...] = ()  # SPECS detail units of ``caption`` (when base/detail are not given)
    false_units: tuple[str, ...] = ()  # scenes: each unit made false about the image (specs, negatives=controlled)
    perturbed_by_lang: tuple[tuple[str, tuple[str, ...]], ...] = ()  # {"lang": [...]} form of ``perturbed``
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # e.g. the Scene object
    negative: str | None = None  # a hard-negative caption of ``image`` (scenes-tiny recipe)
    more_negatives: tuple[str, ...] = ()  # further hard negatives of ``image`` (scenes-tiny, negatives_per_image > 1)


def check_fields(examples: list[Example], needs: tuple[str, ...], recipe: str) -> None:
    if not examples:
        raise CapscoreError(f"recipe {recipe!r}: no training examples")
    for ex in examples:
        for f in needs:
            if not getattr(ex, f):
                raise InputError(ex.source or "example", f"recipe {recipe!r} needs field {f!r}", got=getattr(ex, f))


def read_jsonl(path: str | Path) -> list[Example]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CapscoreError(f"{path}: training data file not found")
    root = path.parent
    out = []
    for where, row in iter_jsonl(path):
        if not isinstance(row.get("image"), str) or not row["image"] or not isinstance(row.get("caption"), str):
            raise InputError(where, "needs 'image' (a path) and 'caption' (a string)", got=row)
        for key in ("gen_image", "base", "detail", "gen_caption"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise InputError(where, f"{key!r} must be a string", got=row[key])
        tr = row.get("translations") or {}
        if not isinstance(tr, dict) or not all(isinstance(v, str) for v in tr.values()):
            raise InputError(where, "'translations' must be an object {lang: text}", got=tr)
        pert = row.get("perturbed") or []
        by_lang: dict = {}
        if isinstance(pert, dict):
            by_lang, pert = pert, []
            if not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in by_lang.values()):
                raise InputError(where, "'perturbed' must be a list of strings or {lang: [strings]}", got=by_lang)
        elif isinstance(pert, str) or not all(isinstance(p, str) for p in pert):
            raise InputError(where, "'perturbed' must be a list of strings or {lang: [strings]}", got=pert)

        def img(key):
            return ImageRef(path=root / row[key], name=f"{where}: {row[key]}") if row.get(key) else None

        out.append(Example(img("image"), row["caption"], row.get("base"), row.get("detail"), tuple(pert),
                           tuple(sorted(tr.items())), img("gen_image"), row.get("gen_caption"), where,
                           perturbed_by_lang=tuple(sorted((k, tuple(v)) for k, v in by_lang.items()))))
    return out


def specs_units(examples: list[Example], *, grammar: str = "capscore") -> tuple[list[Example], list[str]]:
    """Detail units for the SPECS examples that lack ``base``/``detail``.

    SPECS §4.3 fine-tunes on "ShareGPT-4V captions, segmented as described above"
    (§4.2, App. A): the caption is cut with :func:`capscore.probes.segment.detail_units`
    and every draw builds a triplet from a random prefix (see the ``specs`` recipe).
    Returns (usable examples, sources of the examples skipped because their caption
    has fewer than two units and so gives no (c_j, c_j + d⁺) pair). Callers report the
    skipped ones.
    """
    from capscore.probes.segment import detail_units  # noqa: PLC0415  (deferred: numpy, torch)

    out, skipped = [], []
    for ex in examples:
        if ex.base and ex.detail:
            out.append(ex)
            continue
        if ex.base or ex.detail:
            raise InputError(ex.source or "example", "give both 'base' and 'detail', or neither (the caption is "
                             "then segmented into detail units)", got={"base": ex.base, "detail": ex.detail})
        # exact units given by the data (scenes: from the scene graph) are kept, not re-segmented
        units = ex.units or tuple(detail_units(ex.caption, grammar=grammar))
        if len(units) < 2:
            skipped.append(ex.source)
            continue
        out.append(replace(ex, units=units))
    return out, skipped


def negative_detail(details: list[str], i: int, rng: random.Random, *, shuffle_prob: float = 0.9) -> str:
    """d⁻ for example ``i`` (SPECS, section 3): the detail unit of another example in the batch,
    with its words shuffled with probability ``shuffle_prob`` (0.9).

    Open choices: the other example is drawn uniformly from the rest of the batch
    (a batch of one reuses its own detail); "token" = whitespace-separated word.
    """
    others = [j for j in range(len(details)) if j != i] or [i]
    words = details[rng.choice(others)].split()
    if rng.random() < shuffle_prob:
        rng.shuffle(words)
    return " ".join(words)


# ----------------------------------------------------------------------------- scenes
def scene_examples(n: int, *, seed: int = 0, split: str = "train", size: int = 64,
                   languages: tuple[str, ...] = (), start: int = 0) -> list[Example]:
    """Training examples from the synthetic scenes (``capscore.scenes``).

    caption = the long caption; units = its exact detail units from the scene graph,
    so that SPECS draws a random prefix c_j and the next unit for every triplet, as
    on segmented captions (SPECS §3.1/§4.3; scenes with one unit give no triplet and
    are skipped by :func:`specs_units`); translations = the short caption in
    ``languages``; gen_image = the same scene graph re-rendered with every object moved
    inside its grid cell (relations unchanged); gen_caption = a paraphrase of the short
    caption; false_units = each unit made false about the scene
    (:meth:`~capscore.scenes.graph.Scene.false_detail_units`, drawn from their own stream, so the other
    fields are what they were before it existed).
    """
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    from capscore.scenes import generate_scenes  # noqa: PLC0415  (deferred: numpy)

    out = []
    for sc in generate_scenes(n, seed=seed, split=split, size=size, start=start):
        units = sc.detail_units()
        tr = sc.translations() if languages else {}
        missing = [lang for lang in languages if lang not in tr]
        if missing:
            raise CapscoreError(f"scenes have no captions in {missing}; available: {sorted(tr)}")
        para = sc.paraphrases(n=1)
        out.append(Example(
            ImageRef(image=sc.render(), name=sc.id), " ".join(units), units=tuple(units),
            translations=tuple((lang, tr[lang]) for lang in languages) + (("en", sc.short_caption()),),
            gen_image=ImageRef(image=rerender(sc), name=sc.id + "/rerendered"),
            gen_caption=para[0] if para else sc.short_caption(),
            false_units=tuple(sc.false_detail_units(np.random.default_rng([seed, sc.index, 1907]))),
            source=sc.id, extra={"scene": sc},
        ))
    return out


def rerender(scene, *, jitter: float = 0.6):
    """The scene re-drawn with each object displaced inside its cell (a new layout of the same graph)."""
    import numpy as np  # noqa: PLC0415  (deferred: numpy)

    from capscore.scenes.graph import GRID, SceneObject, render_objects  # noqa: PLC0415  (deferred: numpy)

    rng = np.random.default_rng([scene.seed, scene.index, 777])
    moved = []
    for o in scene.objects:
        r = o.radius(scene.size) / scene.size
        slack = max(0.0, 0.5 / GRID - r) * jitter
        x = (o.col + 0.5) / GRID + float(rng.uniform(-slack, slack))
        y = (o.row + 0.5) / GRID + float(rng.uniform(-slack, slack))
        moved.append(SceneObject(o.shape, o.color, o.size, o.pattern, o.row, o.col, x, y))
    return render_objects(tuple(moved), scene.size)
